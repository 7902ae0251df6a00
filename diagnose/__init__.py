"""diagnose: see what is really happening inside PyTorch Transformers.

Attention maps and activation statistics through hooks (find_heads, capture,
attention_summary), causal evidence by head ablation (ablate_heads), training health
(TrainingMonitor, read_run), wiring checks (check_model) and one offline HTML report
(write_report). Every hook lives only inside a call and is removed in `finally`.
"""

from .ablation import HeadEffect, HeadsResult, ablate_heads
from .adapters.base import AttentionSite
from .attention_stats import AttentionSummary, attention_summary
from .capture import Capture, capture
from .checks import Finding, check_model, check_training_setup
from .errors import DiagnoseError
from .io import DataSet, load_data, load_model, save_checkpoint
from .monitor import Run, Thresholds, TrainingMonitor, read_run
from .reports import write_report
from .sites import find_heads, register_adapter

__version__ = "0.1.0"

__all__ = [
    "AttentionSite",
    "AttentionSummary",
    "Capture",
    "DataSet",
    "DiagnoseError",
    "Finding",
    "HeadEffect",
    "HeadsResult",
    "Run",
    "Thresholds",
    "TrainingMonitor",
    "__version__",
    "ablate_heads",
    "attention_summary",
    "capture",
    "check_model",
    "check_training_setup",
    "find_heads",
    "load_data",
    "load_model",
    "read_run",
    "register_adapter",
    "save_checkpoint",
    "write_report",
]
