"""diagnose: see what is really happening inside PyTorch Transformers.

Attention maps and activation statistics through hooks (find_heads, capture,
attention_summary), causal evidence by head ablation (ablate_heads),
circuits of heads with the same evidence (find_circuit), head pruning (prune_heads), training health
(TrainingMonitor, read_run), wiring checks (check_model) and one offline HTML report
(write_report). The hooks a function registers are removed in `finally` before it returns; a
TrainingMonitor's hooks live until its close() (or the end of its `with` block).
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_names

from . import errors
from .errors import *  # noqa: F403 -- every error class (errors.__all__), so a new one is exported as it is made

# Public names and the module each lives in. They are imported on first use (PEP 562), so
# that `import diagnose` and `diagnose --help` do not pay for torch, scipy and pandas.
_EXPORTS = {
    "GroupEffect": ".ablation", "HeadEffect": ".ablation", "HeadsResult": ".ablation", "ablate_heads": ".ablation",
    "ablate_together": ".ablation", "CheckpointsResult": ".ablation", "compare_checkpoints": ".ablation",
    "AttentionSite": ".adapters.base", "InterceptAdapter": ".adapters",
    "NormForm": ".adapters.norms", "register_norm": ".adapters.norms", "unregister_norm": ".adapters.norms",
    "AttentionSummary": ".attention_stats", "attention_summary": ".attention_stats",
    "Capture": "._capture", "capture": "._capture",
    "CircuitResult": ".circuit", "find_circuit": ".circuit",
    "use_forward": ".calling",
    "Finding": ".checks", "check_model": ".checks", "check_training_setup": ".checks",
    "DataSet": ".io", "load_data": ".io", "load_data_for": ".io", "load_model": ".io", "save_checkpoint": ".io",
    "MonitorConfig": ".monitor", "Run": ".monitor", "Thresholds": ".monitor", "TrainingMonitor": ".monitor",
    "read_run": ".monitor",
    "PruneResult": ".prune", "prune_heads": ".prune",
    "Registry": ".registry",
    "write_report": ".reports",
    "find_heads": ".sites", "register_adapter": ".sites",
}

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from .ablation import (CheckpointsResult, GroupEffect, HeadEffect, HeadsResult, ablate_heads, ablate_together,
                           compare_checkpoints)
    from .adapters import InterceptAdapter
    from .adapters.base import AttentionSite
    from .adapters.norms import NormForm, register_norm, unregister_norm
    from .attention_stats import AttentionSummary, attention_summary
    from ._capture import Capture, capture
    from .calling import use_forward
    from .circuit import CircuitResult, find_circuit
    from .checks import Finding, check_model, check_training_setup
    from .io import DataSet, load_data, load_data_for, load_model, save_checkpoint
    from .monitor import MonitorConfig, Run, Thresholds, TrainingMonitor, read_run
    from .prune import PruneResult, prune_heads
    from .registry import Registry
    from .reports import write_report
    from .sites import find_heads, register_adapter


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)


__version__ = "0.1.0"

# Folder kinds diagnose writes register with io here, before any io code can run: io never imports
# the parts that write them (diagnose/io/_kinds.py). Costs no torch.
from . import prune as _prune  # noqa: E402  (registers the pruned-folder kind)

__all__ = [
    "AttentionSite",
    "AttentionSummary",
    "Capture",
    "CircuitResult",
    "CheckpointsResult",
    "DataSet",
    "Finding",
    "GroupEffect",
    "HeadEffect",
    "HeadsResult",
    "InterceptAdapter",
    "MonitorConfig",
    "NormForm",
    "PruneResult",
    "Registry",
    "Run",
    "Thresholds",
    "TrainingMonitor",
    "__version__",
    "ablate_heads",
    "ablate_together",
    "attention_summary",
    "capture",
    "check_model",
    "check_training_setup",
    "find_circuit",
    "compare_checkpoints",
    "find_heads",
    "load_data",
    "load_data_for",
    "load_model",
    "prune_heads",
    "read_run",
    "register_adapter",
    "register_norm",
    "save_checkpoint",
    "unregister_norm",
    "use_forward",
    "write_report",
]
__all__ += errors.__all__
