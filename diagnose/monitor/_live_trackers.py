"""The trackers' live sinks: TensorBoard, Weights & Biases, MLflow and Lightning's loggers.

Each imports its library when it is created (extras `tensorboard`, `wandb`, `mlflow`), and says
which extra to install when it is missing. Each writes through the tracker's own client and
leaves a run the user opened to the user: only a run a sink opened itself is closed by it.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from typing import Any

from .._numbers import number
from ..errors import ConfigError, UsageError
from ._live import LiveSink, finite_or_none
from ._sinks import error_text, sink_fix, warn_dropped
from ._tensorboard import summary_writer

MLFLOW_KEY_CHARS = 250  # MLflow's limit on a metric or tag name
_REFUSED = re.compile(r"[^A-Za-z0-9_\-. /]")  # what MLflow (and Lightning's MLFlowLogger) refuse or strip


def mlflow_name(name: str, limit: int = MLFLOW_KEY_CHARS) -> str:
    """`name` as MLflow accepts it, the same way every time (docs/monitor.md, "Names"): each character
    outside A-Z a-z 0-9 _ - . space / becomes `_`, a path part that is empty, `.` or `..` becomes `_`,
    and a name over `limit` (250) characters keeps its first limit - 9 and ends in `-` and 8 hex digits
    of its sha1 (a logger's prefix takes its room from the limit)."""
    out = "/".join(p if p not in ("", ".", "..") else "_" for p in _REFUSED.sub("_", name).split("/"))
    limit = max(limit, 16)
    if len(out) > limit:
        out = f"{out[:limit - 9]}-{hashlib.sha1(name.encode('utf-8', 'replace')).hexdigest()[:8]}"
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

    def __init__(self, logdir: str | os.PathLike | None = None, *, writer: Any = None, flush_secs: float = 10):
        if (logdir is None) == (writer is None):
            raise ConfigError("TensorBoardSink needs a logdir or a writer (one of them)")
        if writer is None:  # a word for flush_secs would kill TensorBoard's writer thread later, where no one sees it
            if number(flush_secs) is None or not 0 < flush_secs < math.inf:
                raise ConfigError(f"TensorBoardSink: flush_secs must be a positive number of seconds, got "
                                  f"{flush_secs!r:.40}")
            writer = summary_writer(logdir, flush_secs, "TensorBoardSink: logdir")
        missing = [m for m in ("add_scalar", "add_text", "flush", "close") if not callable(getattr(writer, m, None))]
        if missing:
            raise UsageError(f"TensorBoardSink: writer= ({type(writer).__name__}) is not a SummaryWriter (it lacks "
                             f"{', '.join(missing)}): pass torch.utils.tensorboard.SummaryWriter(...) or a logdir")
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
        if not all(callable(getattr(self._run, m, None)) for m in ("log", "define_metric")):
            raise UsageError(f"WandbSink: run= ({type(self._run).__name__}) is not a wandb run: pass the run "
                             f"wandb.init() returned")
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
        for name, value in (("run_id", run_id), ("tracking_uri", tracking_uri), ("experiment_id", experiment_id)):
            if value is not None and not isinstance(value, str):
                raise UsageError(f"MLflowSink: {name} ({type(value).__name__}) is not a string")
        self.mlflow = _need("mlflow", "mlflow")
        try:
            self.client = self.mlflow.MlflowClient(tracking_uri=tracking_uri)
        except Exception as exc:  # noqa: BLE001 - MLflow's own exception types for a store it cannot open
            raise ConfigError(f"MLflowSink: MLflow cannot open the tracking store {tracking_uri or '(its default)'} "
                              f"({error_text(exc)}): pass tracking_uri= a file: folder or a server's http(s) URL, "
                              f"or set MLFLOW_TRACKING_URI") from None
        self._run_id, self._experiment, self._own = run_id, experiment_id, False
        self._check_store()

    def _check_store(self) -> None:
        """Refuse, now, a run or an experiment the store does not hold (or holds deleted): logging to it
        would fail at the first step. With neither, the run is chosen at start: the active one, else a
        new one in the default experiment (which must then exist)."""
        if self._run_id is not None:
            what, name, get = "run", self._run_id, lambda: self.client.get_run(self._run_id).info
        elif self._experiment is not None or self.mlflow.active_run() is None:
            what, name = "experiment", self._experiment or "0"
            get = lambda: self.client.get_experiment(name)  # noqa: E731
        else:
            return
        try:
            stage = get().lifecycle_stage
        except Exception as exc:  # noqa: BLE001 - MLflow's RESOURCE_DOES_NOT_EXIST, or a store that cannot answer
            raise UsageError(f"MLflowSink: the tracking store has no {what} {name!r} ({error_text(exc)}): pass the "
                             f"id of an existing {what} (run_id= or experiment_id=), or start an MLflow run "
                             f"first") from None
        if stage != "active":
            raise UsageError(f"MLflowSink: the {what} {name!r} is {stage}: pass an active {what}'s id")

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
    to an MLflow logger through mlflow_name (it would strip what MLflow refuses, with a warning per
    step), with its prefix counted in the 250 characters, and without NaN or infinities. Each logger is a
    guest of its own: one that raises is warned about once, by name, and dropped; the others go on."""

    fix = "check the trainer's loggers (trainer.loggers)"

    def __init__(self, trainer: Any):
        loggers = getattr(trainer, "loggers", None)
        if loggers is not None and not isinstance(loggers, (list, tuple)):
            raise UsageError(f"LightningLoggersSink: trainer.loggers ({type(loggers).__name__}) is not a list: "
                             f"pass the Lightning Trainer")
        self.trainer = trainer
        self._dropped: set[int] = set()  # id() of the loggers that failed

    def log(self, scalars: dict[str, float], step: int) -> None:
        for logger in list(getattr(self.trainer, "loggers", []) or []):
            if id(logger) in self._dropped:
                continue
            try:
                logger.log_metrics(_for_logger(logger, scalars), step=step)
            except Exception as exc:  # noqa: BLE001 - this logger is dropped, said once; the others go on
                self._dropped.add(id(logger))
                fix = sink_fix(logger, "log_metrics", "check that logger (its folder, its server, its run), or take "
                                                      "it out of the Trainer's loggers")
                warn_dropped(type(logger).__name__, "log_metrics", exc, fix, what="Lightning logger")


def _for_logger(logger: Any, scalars: dict[str, float]) -> dict[str, float]:
    """The scalars as this logger takes them: an MLflow logger's names through mlflow_name (its own
    prefix and `-` counted in MLflow's 250 characters) and its NaN and infinities left out."""
    if "mlflow" not in type(logger).__name__.lower():
        return scalars
    prefix = getattr(logger, "_prefix", "") or ""
    room = MLFLOW_KEY_CHARS - (len(prefix) + 1 if isinstance(prefix, str) and prefix else 0)
    return {mlflow_name(k, room): v for k, v in scalars.items() if finite_or_none(v) is not None}
