"""Training health: TrainingMonitor writes a diagnose.run/1 folder; read_run reads it back."""

from ._alerts import Thresholds
from ._monitor import TrainingMonitor
from ._runfolder import Run, read_run

__all__ = ["TrainingMonitor", "Thresholds", "Run", "read_run"]
