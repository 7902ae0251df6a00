"""PyTorch Lightning callback (extra: `lightning`): Trainer(callbacks=[DiagnoseCallback("runs/x")])."""

from __future__ import annotations

import os
from typing import Any

from ._monitor import TrainingMonitor


def _base():
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        try:
            from pytorch_lightning.callbacks import Callback
        except ImportError:
            raise ImportError("DiagnoseCallback needs lightning: pip install 'diagnose[lightning]'") from None
    return Callback


class DiagnoseCallback(_base()):
    """Runs a TrainingMonitor inside Lightning's loop.

    Lightning unscales AMP gradients before `on_before_optimizer_step` and clips after it, so
    the norms read there are unscaled and pre-clip; the loss comes from `on_before_backward`.
    Steps are the trainer's global step. Extra keyword arguments go to TrainingMonitor.
    """

    def __init__(self, run_dir: str | os.PathLike, **monitor_kwargs: Any):
        super().__init__()
        self.run_dir, self.kwargs = run_dir, monitor_kwargs
        self.monitor: TrainingMonitor | None = None
        self._loss = None

    def on_fit_start(self, trainer, pl_module) -> None:
        kwargs = dict(self.kwargs)
        kwargs.setdefault("clip", trainer.gradient_clip_val or None)
        self.monitor = TrainingMonitor(pl_module, self.run_dir, **kwargs)

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._loss = loss.detach()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self.monitor is not None:
            self.monitor.step(self._loss, optimizer=optimizer, step=trainer.global_step)

    def _close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None

    def on_fit_end(self, trainer, pl_module) -> None:
        self._close()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._close()
