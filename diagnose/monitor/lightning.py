"""PyTorch Lightning callback (extra: `lightning`): Trainer(callbacks=[DiagnoseCallback("runs/x")])."""

from __future__ import annotations

import os
import warnings
from dataclasses import replace
from typing import Any, Iterable

import torch

from ._actions import note
from ._config import MonitorConfig
from ._live_trackers import LightningLoggersSink
from ._monitor import TrainingMonitor
from ._evals import log_trainer_eval
from ._spikes import join_micro_batches


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
    the norms read there are unscaled and pre-clip; `clip` in run.json is gradient_clip_val.
    The loss is the optimizer step's: the mean of its micro-batches' training_step losses
    (Lightning hands `on_before_backward` each one divided by accumulate_grad_batches; the
    division is undone). Steps are the trainer's global step. Validation metrics logged with
    self.log during validation go to evals.jsonl (a metric named like `val_loss` / `val/loss`
    / `loss` is the eval loss). stop_on=("nonfinite",) sets trainer.should_stop when such an
    alert fires; loggers=True also streams diagnose's scalars, under `diagnose/`, into the trainer's
    own loggers (trainer.loggers: TensorBoard, wandb, MLflow, CSV); config= (a MonitorConfig) and
    other keyword arguments (sinks= among them) are TrainingMonitor's settings.
    """

    def __init__(self, run_dir: str | os.PathLike, *, stop_on: Iterable[str] = (), loggers: bool = False,
                 config: MonitorConfig | None = None, **monitor_kwargs: Any):
        super().__init__()
        self.run_dir, self.loggers = run_dir, loggers
        self.config = MonitorConfig.of(config, monitor_kwargs, caller="DiagnoseCallback")  # checked before fit
        # stop_on ends the trainer's loop (no exception), and writes the step to skips.json as the monitor's would
        self.stop_on = frozenset((stop_on,) if isinstance(stop_on, str) else stop_on) | self.config.stop_on
        self.config = replace(self.config, stop_on=())
        self.monitor: TrainingMonitor | None = None
        self._losses: list[torch.Tensor] = []
        self._batches: list[Any] = []
        self._before_val: dict[str, Any] = {}

    def on_fit_start(self, trainer, pl_module) -> None:
        if self.loggers and not (getattr(trainer, "loggers", None) or []) and trainer.is_global_zero:
            warnings.warn("diagnose: DiagnoseCallback(loggers=True), but the Trainer has no logger "
                          "(logger=False): nothing is streamed; fix: give the Trainer a logger, or drop loggers=True",
                          RuntimeWarning, stacklevel=2)
        config = self.config.with_trainer(clip=trainer.gradient_clip_val or None, settings={"integration": "lightning"},
                                          sinks=[LightningLoggersSink(trainer)] if self.loggers else [])
        self.monitor = TrainingMonitor(pl_module, self.run_dir, config=config)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.monitor is not None and self.monitor.save_spikes:
            self._batches.append(batch)

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._losses.append(loss.detach() * trainer.accumulate_grad_batches)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self.monitor is None:
            return
        loss = torch.stack([x.float().reshape(()) for x in self._losses]).mean() if self._losses else None
        batch = join_micro_batches(self._batches) if self._batches else None
        n = len(self._losses) or None
        self._losses, self._batches = [], []
        self.monitor.step(loss, optimizer=optimizer, step=trainer.global_step, micro_batches=n, batch=batch)
        stop = {a["kind"] for a in self.monitor.last_alerts} & self.stop_on
        if stop:
            note(self.monitor, self.monitor.last_alerts[0]["step"], stop, "stopped")
            trainer.should_stop = True

    def on_validation_start(self, trainer, pl_module) -> None:
        self._before_val = dict(trainer.callback_metrics)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.monitor is None or trainer.sanity_checking:
            return
        new = {k: v for k, v in trainer.callback_metrics.items()
               if self._before_val.get(k) is not v and isinstance(v, torch.Tensor) and v.numel() == 1}
        if not new:
            return
        loss_key = next((k for k in new if k.replace("/", "_") in ("val_loss", "valid_loss", "validation_loss")),
                        next((k for k in new if k == "loss"), None))
        loss = new.pop(loss_key) if loss_key is not None else None
        log_trainer_eval(self.monitor, trainer.global_step, loss, new)

    def _close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None

    def on_fit_end(self, trainer, pl_module) -> None:
        self._close()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._close()
