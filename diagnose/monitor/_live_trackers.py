"""The trackers' live sinks: TensorBoard, Weights & Biases, MLflow and Lightning's loggers.

Each imports its library when it is created (extras `tensorboard`, `wandb`, `mlflow`), and says
which extra to install when it is missing. Each writes through the tracker's own client and
leaves a run the user opened to the user: only a run a sink opened itself is closed by it.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

from ..errors import ConfigError, UsageError
from ._live import LiveSink, finite_or_none

MLFLOW_KEY_CHARS = 250  # MLflow's limit on a metric or tag name
_REFUSED = re.compile(r"[^A-Za-z0-9_\-. /]")  # what MLflow (and Lightning's MLFlowLogger) refuse or strip


def mlflow_name(name: str) -> str:
    """`name` as MLflow accepts it, the same way every time (docs/monitor.md, "Names"): each character
    outside A-Z a-z 0-9 _ - . space / becomes `_`, a path part that is empty, `.` or `..` becomes `_`,
    and a name over 250 characters keeps its first 241 and ends in `-` and 8 hex digits of its sha1."""
    out = "/".join(p if p not in ("", ".", "..") else "_" for p in _REFUSED.sub("_", name).split("/"))
    if len(out) > MLFLOW_KEY_CHARS:
        out = f"{out[:MLFLOW_KEY_CHARS - 9]}-{hashlib.sha1(name.encode('utf-8', 'replace')).hexdigest()[:8]}"
    return out


def _need(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"this sink needs {extra}: pip install 'diagnose-transformers[{extra}]'") from None


class TensorBoardSink(LiveSink):
    """Scalars (and alerts as text) into TensorBoard event files in `logdir`, or into the user's
    own `writer` (a torch.utils.tensorboard SummaryWriter, left open). flush_secs: how stale the
    live view may be (TensorBoard reads what was flushed)."""

    fix = "check that the logdir is writable and the SummaryWriter still open"

    def __init__(self, logdir: str | os.PathLike | None = None, *, writer: Any = None, flush_secs: int = 10):
        if (logdir is None) == (writer is None):
            raise ConfigError("TensorBoardSink needs a logdir or a writer (one of them)")
        if writer is None:
            if os.path.lexists(logdir) and not os.path.isdir(logdir):
                raise ConfigError(f"TensorBoardSink: logdir {os.fspath(logdir)} is a file or a dangling symlink, not a "
                                  f"folder: give a folder's path")
            _need("tensorboard", "tensorboard")
            writer = _need("torch.utils.tensorboard", "tensorboard").SummaryWriter(
                log_dir=str(logdir), flush_secs=flush_secs)
        self.writer, self._own = writer, logdir is not None

    def log(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        self.writer.add_text(tag, text, step)

    def close(self, steps_seen: int) -> None:
        if self._own:
            self.writer.close()
        else:
            self.writer.flush()


class WandbSink(LiveSink):
    """Scalars into a Weights & Biases run: `run`, else the active `wandb.run` when the sink is made (the
    Hugging Face callback makes it in on_train_begin, after the Trainer's own wandb callback opened the run).

    The values carry `diagnose/step` and are plotted against it (wandb.define_metric), so that
    diagnose never moves the run's own step counter; alerts also go to the run's summary as text.
    UsageError when it is made without a run to write to (no wandb.init() yet, or a finished run)."""

    fix = "keep the wandb run open until TrainingMonitor.close() (wandb.finish() after it)"

    def __init__(self, run: Any = None):
        self.wandb = _need("wandb", "wandb")
        self._run = run if run is not None else self.wandb.run
        if self._run is None:
            raise UsageError("WandbSink: no wandb run: call wandb.init() before making the sink, or pass "
                             "WandbSink(run=...)")
        if getattr(self._run, "_is_finished", False):
            raise UsageError("WandbSink: the wandb run is finished (wandb.finish() ran): pass an open run")

    def _active(self) -> Any:
        if not getattr(self, "_defined", False):
            self._run.define_metric(f"{self.prefix}step")
            self._run.define_metric(f"{self.prefix}*", step_metric=f"{self.prefix}step")
            self._defined = True
        return self._run

    def start(self, info: dict[str, Any]) -> None:
        self._active().config.update({"diagnose": info.get("settings", {})}, allow_val_change=True)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self._active().log({**scalars, f"{self.prefix}step": step})

    def text(self, tag: str, text: str, step: int) -> None:
        self._active().summary[tag] = text  # the last alert of each kind, readable in the run's page


class MLflowSink(LiveSink):
    """Scalars into an MLflow run: `run_id`, else the active run, else a run this sink starts (and
    ends at close). tracking_uri: the store (default: MLflow's own setting). MLflow refuses NaN
    and infinities in some stores: they are left out here (the run folder keeps them); names it
    refuses are rewritten by mlflow_name."""

    fix = "check the tracking_uri and that the MLflow run is still open"

    def __init__(self, run_id: str | None = None, *, tracking_uri: str | None = None,
                 experiment_id: str | None = None):
        self.mlflow = _need("mlflow", "mlflow")
        self.client = self.mlflow.MlflowClient(tracking_uri=tracking_uri)
        self._run_id, self._experiment, self._own = run_id, experiment_id, False

    def start(self, info: dict[str, Any]) -> None:
        if self._run_id is None:
            active = self.mlflow.active_run()
            if active is not None:
                self._run_id = active.info.run_id
            else:
                run = self.client.create_run(self._experiment or "0", run_name="diagnose")
                self._run_id, self._own = run.info.run_id, True

    @property
    def run_id(self) -> str | None:
        return self._run_id

    def log(self, scalars: dict[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_name(k), v, now, step) for k, v in scalars.items() if finite_or_none(v) is not None]
        for i in range(0, len(metrics), 1000):  # MLflow's batch limit
            self.client.log_batch(self._run_id, metrics=metrics[i:i + 1000])

    def text(self, tag: str, text: str, step: int) -> None:
        self.client.set_tag(self._run_id, mlflow_name(tag), text[:5000])  # the last alert of each kind

    def close(self, steps_seen: int) -> None:
        if self._own:
            self.client.set_terminated(self._run_id)


class LightningLoggersSink(LiveSink):
    """Scalars into every logger a Lightning Trainer has (trainer.loggers: TensorBoard, wandb,
    MLflow, CSV, ...), through their log_metrics; the Lightning callback's `loggers=True`. Names go
    to an MLflow logger through mlflow_name (it would strip what MLflow refuses, with a warning per step)."""

    fix = "check the trainer's loggers (trainer.loggers)"

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def log(self, scalars: dict[str, float], step: int) -> None:
        for logger in getattr(self.trainer, "loggers", []) or []:
            if "mlflow" in type(logger).__name__.lower():
                logger.log_metrics({mlflow_name(k): v for k, v in scalars.items()}, step=step)
            else:
                logger.log_metrics(scalars, step=step)
