"""Where the monitor's records go: a list of sinks, the run folder first.

Every sink receives, on rank 0 and in the order they are made: start(info) once (run.json's
model summary and settings), step(record) per logged step (attention samples ride in the
record's `attention`), alert(alert) per alert after its step, eval(record) per log_eval, and
close(steps_seen) once. The run folder (`RunFolderSink`) is the source of truth and the one the
readers use; a live tracker (wandb, TensorBoard, MLflow) is one more Sink subclass in its own
file, passed as TrainingMonitor(..., sinks=[...]) (the trainers' callbacks pass it through).

An error raised by a sink stops the step that called it, after the sinks before it (the run
folder first) have their record.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from ..errors import UsageError
from ._runfolder import RunWriter
from ._spikes import save_spike

_METHODS = ("start", "step", "alert", "eval", "close")


class Sink:
    """Base of a sink: every method does nothing until a subclass overrides it."""

    def start(self, info: dict[str, Any]) -> None:
        """Once, before the first step: run.json's model summary and settings."""

    def step(self, record: dict[str, Any]) -> None:
        """One logged step's record (metrics.jsonl's object, without the run folder's `session`)."""

    def alert(self, alert: dict[str, Any]) -> None:
        """One alert (alerts.jsonl's object), after the step it belongs to."""

    def eval(self, record: dict[str, Any]) -> None:
        """One TrainingMonitor.log_eval record (evals.jsonl's object, without `session`)."""

    def close(self, steps_seen: int) -> None:
        """Once, from TrainingMonitor.close(): flush and let go."""


class RunFolderSink(Sink):
    """The `diagnose.run/1` folder (_runfolder.py); also keeps the batches behind spike alerts."""

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir)
        self.writer: RunWriter | None = None

    def start(self, info: dict[str, Any]) -> None:
        self.writer = RunWriter(self.dir, info)

    def step(self, record: dict[str, Any]) -> None:
        self.writer.write_step(record)

    def alert(self, alert: dict[str, Any]) -> None:
        self.writer.write_alert(alert)

    def eval(self, record: dict[str, Any]) -> None:
        self.writer.write_eval(record)

    def spike(self, step: int, kinds: list[str], batch: Any, per_example_loss: Any, max_bytes: int,
              **state: Any) -> None:
        """state: model, optimizer, previous for the replay (_spike_state.py)."""
        save_spike(self.dir, step, kinds, batch, per_example_loss, max_bytes, **state)

    def close(self, steps_seen: int) -> None:
        if self.writer is not None:
            self.writer.close(steps_seen=steps_seen)


def check_sinks(sinks: Iterable[Any] | None) -> list[Any]:
    """The user's sinks as a list (a plain function f(scalars, step) becomes a CallableSink);
    UsageError for one that lacks a sink's methods."""
    from ._live import CallableSink

    if sinks is None:
        return []
    if isinstance(sinks, (str, bytes, os.PathLike)) or not isinstance(sinks, Iterable):
        raise UsageError(f"sinks must be a list of Sink objects, got {type(sinks).__name__}")
    out = [CallableSink(s) if callable(s) and not isinstance(s, Sink) and not hasattr(s, "step") else s
           for s in sinks]
    for s in out:
        missing = [m for m in _METHODS if not callable(getattr(s, m, None))]
        if missing:
            raise UsageError(f"sink {type(s).__name__} lacks {', '.join(missing)}: subclass "
                             f"diagnose.monitor.Sink and override what it needs")
    return out


def close_all(sinks: list[Any], steps_seen: int) -> None:
    """Close every sink, even when one fails; the first error is raised after all were closed."""
    error = None
    for s in sinks:
        try:
            s.close(steps_seen)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others are closed
            error = error or exc
    if error is not None:
        raise error
