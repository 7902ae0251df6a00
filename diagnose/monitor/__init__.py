"""Training health: TrainingMonitor writes a diagnose.run/1 folder; read_run reads it back."""

from .alerts import Thresholds
from .monitor import TrainingMonitor
from .runfolder import Run, read_run

__all__ = ["TrainingMonitor", "Thresholds", "Run", "read_run"]
