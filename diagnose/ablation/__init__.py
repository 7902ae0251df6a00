"""Head ablation through the one head gate: which heads matter, with significance.

Public: `ablate_heads` (every head, or --fast's top ones), `ablate_together` (a set of heads
closed at once), their results `HeadsResult` / `HeadEffect` / `GroupEffect`, and the
`diagnose.heads/1` SCHEMA they write.

Modules, in the order one `ablate_heads` call uses them:
- engine: `ablate_heads`: checks the options, runs the exact or the --fast steps, assembles the result.
- batches: data into (inputs, labels) batches on the model's device.
- gate: the head gate (the one ablation mechanism) on each attention site; zero or mean fill.
- sweep: one clean pass per batch, then heads ablated several per forward, through prefix.
- prefix: replays the unchanged blocks below an ablated layer from the clean pass.
- accumulate: per-example sums over the data, and the per-head effects and tests from them.
- significance: sign test, sign-flip permutation test, bootstrap CIs, Holm / BH.
- attention: each head's attention statistics and a few kept maps (attention_stats underneath).
- roles: names what each head's attention does, from the model's own heads.
- contrast: heatmap versus effect: rank correlations and the flags, groups closed together.
- together: `ablate_together`, also used by contrast for backups and redundant groups.
- result: the dataclasses, the JSON (`to_json`, `save`) and a DataFrame.
"""

from .engine import METHODS, ablate_heads
from .result import SCHEMA, HeadEffect, HeadsResult
from .together import GroupEffect, ablate_together

__all__ = ["METHODS", "SCHEMA", "GroupEffect", "HeadEffect", "HeadsResult", "ablate_heads", "ablate_together"]
