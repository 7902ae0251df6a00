"""Head ablation through the one head gate: which heads matter, with significance.

Public: `ablate_heads` (every head, or --fast's top ones), `ablate_methods` (the same under several
methods, and whether each head's verdict agrees), `ablate_together` (a set of heads closed at once), their
results `HeadsResult` / `HeadEffect` / `GroupEffect`, and the
`diagnose.heads/2` SCHEMA they write.

Modules, in the order one `ablate_heads` call uses them:
- config: `AblationConfig`, every option of `ablate_heads` in one place, checked once.
- engine: `ablate_heads`: plans the passes, prepares the method, runs a way of steps, assembles the result.
- batches: data into (inputs, labels) batches on the model's device.
- methods: the `AblationMethod` registry (zero, mean, resample): a method's data pass and what a closed head
  becomes; resample: the donors and their recorded outputs.
- observe: one pass over the data with an observer on every gate (mean's and resample's data pass).
- gate: the head gate (the one ablation mechanism) on each attention site, and `close_heads`, the scales.
- plan: the micro-batch and the heads per forward that fit the memory.
- sweep: one clean pass per batch, then heads ablated several per forward, through prefix; a base of
  closed heads stays shut throughout (groups, prune's removals).
- steps: every head, or the ranked heads only (--fast, prune's rounds), over the plan's micro-batches.
- progress: plain progress events for a caller's callback, and `ProgressLog`, their lines for a log.
- scored: the logits made at the scored positions only (the adapter's output layer sees only them).
- prefix: replays the unchanged blocks below an ablated layer from the clean pass.
- accumulate: per-example sums over the data, and the per-head effects and tests from them.
- significance: sign test, sign-flip permutation test, bootstrap CIs, Holm / BH.
- attention: each head's attention statistics and a few kept maps (attention_stats underneath).
- roles: names what each head's attention does, from the model's own heads.
- contrast: heatmap versus effect: rank correlations and the flags, groups closed together.
- together: `ablate_together`, also used by contrast for backups and redundant groups.
- shards: every rank's sums as one.
- verdict: one language for significance and size (matters, detectable but negligible, negligible,
  undecided), and the agreement across methods.
- analyses: the registry of analysis steps run after the sweep, each adding a `Section` to the result.
- result: the dataclasses, the JSON (`to_json`, `save`) and a DataFrame.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_names

from .analyses import ANALYSES, Analysis, AnalysisInput, register_analysis, unregister_analysis
from .methods import METHODS, AblationMethod, register_method

# imported on first use (PEP 562): the CLI reads METHODS from the registry without paying for torch
_EXPORTS = {"AblationConfig": ".config", "ProgressEvent": ".progress", "ProgressLog": ".progress", "ablate_heads": ".engine",
            "ablate_methods": ".engine",
            "SCHEMA": ".result", "HeadEffect": ".result", "HeadsResult": ".result",
            "GroupEffect": ".together", "ablate_together": ".together",
            "CheckpointsResult": ".checkpoints", "compare_checkpoints": ".checkpoints"}

if TYPE_CHECKING:
    from .checkpoints import CheckpointsResult, compare_checkpoints
    from .config import AblationConfig
    from .engine import ablate_heads, ablate_methods
    from .progress import ProgressEvent, ProgressLog
    from .result import SCHEMA, HeadEffect, HeadsResult
    from .together import GroupEffect, ablate_together


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)


__all__ = ["ANALYSES", "METHODS", "SCHEMA", "AblationConfig", "AblationMethod", "Analysis", "AnalysisInput",
           "CheckpointsResult", "compare_checkpoints",
           "GroupEffect", "HeadEffect", "HeadsResult", "ProgressEvent", "ProgressLog", "ablate_heads", "ablate_methods",
           "ablate_together", "register_analysis", "register_method", "unregister_analysis"]
