"""Where the monitor's records go: a list of sinks, the run folder first.

Every sink receives, on rank 0 and in the order they are made: start(info) once (run.json's
model summary and settings), step(record) per logged step (attention samples ride in the
record's `attention`), alert(alert) per alert after its step, eval(record) per log_eval, and
close(steps_seen) once. The run folder (`RunFolderSink`) is the source of truth and the one the
readers use; a live tracker (wandb, TensorBoard, MLflow) is one more Sink subclass in its own
file, passed as TrainingMonitor(..., sinks=[...]) (the trainers' callbacks pass it through).

The run folder is the monitor's own; every other sink is a guest (`Guest`): each call into it
gets its own copy of the payload, is timed apart (the time a sink takes is left out of
`step_time` and written as `sink_time`), and an exception it raises is caught: warned once
(RuntimeWarning) naming the sink, the call and the fix, and the sink is dropped for the rest of the
run (no retry: a tracker that failed once would fail or lag on every step); only its close() is
still called, once, at the end, so that it lets go of its files and of a run it opened (a failure
there is not warned again: the sink was named once). Training, the run folder, the alerts,
`on_alert`, `raise_on` and the spike batch go on exactly as without it. KeyboardInterrupt and
SystemExit pass.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping

from .._write import check_output
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

    def __init__(self, run_dir: str | os.PathLike, *, check: bool = True):
        """check: refuse now (OutputError, one line) a run_dir that is a file, a dangling symlink, a FIFO
        or in a folder this process cannot write, rather than with a raw 'File exists' when the set-up
        makes it (at the first forward, mid-training, for a model traced there); rank 0 checks."""
        if not isinstance(run_dir, (str, os.PathLike)) or isinstance(os.fspath(run_dir), bytes):
            raise UsageError(f"run_dir ({type(run_dir).__name__}) is not a folder's path: give one, or None")
        if check:
            check_output(run_dir, option="run_dir (the run folder)", folder=True)
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
    if isinstance(sinks, (str, bytes, os.PathLike, Mapping)) or not isinstance(sinks, Iterable):
        raise UsageError(f"sinks must be a list of Sink objects, got {type(sinks).__name__}")
    sinks = list(sinks)
    for s in sinks:
        if isinstance(s, type):  # TensorBoardSink, not TensorBoardSink(logdir): its methods want a self
            raise UsageError(f"sinks holds the class {s.__name__}, not a sink: pass an instance, "
                             f"e.g. {s.__name__}(...)")
    out = [CallableSink(s) if callable(s) and not isinstance(s, Sink) and not hasattr(s, "step") else s
           for s in sinks]
    for s in out:
        missing = [m for m in _METHODS if not callable(getattr(s, m, None))]
        if missing:
            raise UsageError(f"sink {type(s).__name__} lacks {', '.join(missing)}: subclass "
                             f"diagnose.monitor.Sink and override what it needs")
    return out


_clock = time.perf_counter  # a test may swap it for a counter of its own
_ERROR_CHARS = 300  # of a failing sink's message, in the warning


def _copy(value: Any) -> Any:
    """A copy of a record's dicts and lists (numbers and strings are shared: immutable)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def sink_name(sink: Any) -> str:
    """A sink as a warning names it: its class, and a plain function's own name."""
    try:
        fn = getattr(sink, "fn", None)
    except Exception:  # noqa: BLE001 - a property of the user's that raises: the class alone names it
        fn = None
    inner = f"({getattr(fn, '__qualname__', type(fn).__name__)})" if fn is not None else ""
    return f"{type(sink).__name__}{inner}"


def error_text(exc: BaseException) -> str:
    """An exception as one line of at most _ERROR_CHARS, however its tracker wrote it (an exception whose
    own __str__ raises is named by its class)."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - the message of a message that cannot be read
        text = f"{type(exc).__name__} (its message cannot be read)"
    return " ".join(text.split())[:_ERROR_CHARS]


def sink_fix(sink: Any, method: str, default: str | None = None) -> str:
    """The fix a warning names: the sink's own `fix` (a string), else `default`, else a generic one."""
    try:
        fix = getattr(sink, "fix", None)
    except Exception:  # noqa: BLE001 - a property that raises says no fix
        fix = None
    return fix if isinstance(fix, str) and fix.strip() else default or f"fix its {method}(), or leave it out of sinks="


def warn_dropped(name: str, method: str, exc: BaseException, fix: str, what: str = "sink") -> None:
    """The one warning for a guest that failed (a sink, or one logger of a Lightning trainer)."""
    warnings.warn(f"diagnose: {what} {name} failed in {method}() and is dropped for the rest of this run "
                  f"({error_text(exc)}); training, the run folder and the alerts go on without it; fix: {fix}",
                  RuntimeWarning, stacklevel=5)


class Guest(Sink):
    """A user's sink behind a guard (see the module's docstring): the sink is `sink`, the seconds its
    calls took `seconds`, and `dropped` names the call that raised (None while it works)."""

    def __init__(self, sink: Any):
        self.sink, self.seconds, self.dropped = sink, 0.0, None

    def _call(self, method: str, payload: Any) -> None:
        if self.dropped is not None:
            return
        start = _clock()
        try:
            getattr(self.sink, method)(payload)
        except Exception as exc:  # noqa: BLE001 - said once below; the training run must go on
            self.dropped = method
            warn_dropped(sink_name(self.sink), method, exc, sink_fix(self.sink, method))
        finally:
            self.seconds += _clock() - start

    def __getattr__(self, name: str) -> Any:  # the guest's own attributes (MLflowSink.run_id) read through
        if name == "sink":
            raise AttributeError(name)
        return getattr(self.sink, name)

    def start(self, info: dict[str, Any]) -> None:
        self._call("start", _copy(info))

    def step(self, record: dict[str, Any]) -> None:
        self._call("step", _copy(record))

    def alert(self, alert: dict[str, Any]) -> None:
        self._call("alert", _copy(alert))

    def eval(self, record: dict[str, Any]) -> None:
        self._call("eval", _copy(record))

    def close(self, steps_seen: int) -> None:
        if self.dropped is None:
            self._call("close", steps_seen)
        elif self.dropped != "close":  # dropped earlier: let go of its files and its run, said once already
            self.dropped = "close"
            try:
                self.sink.close(steps_seen)
            except Exception:  # noqa: BLE001 - the sink's failure was warned when it was dropped
                pass


def guests(sinks: Iterable[Any]) -> list[Guest]:
    """The user's sinks, each behind its guard (one already guarded is kept as it is)."""
    return [s if isinstance(s, Guest) else Guest(s) for s in sinks]


def guest_seconds(sinks: Iterable[Any]) -> float:
    """The seconds the guests among `sinks` have taken so far (left out of step_time)."""
    return sum(s.seconds for s in sinks if isinstance(s, Guest))


def close_all(sinks: list[Any], steps_seen: int) -> None:
    """Close every sink, even when one fails; the first error is raised after all were closed (a guest
    never raises: only the run folder's own error, such as a full disk, reaches the caller)."""
    error = None
    for s in sinks:
        try:
            s.close(steps_seen)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others are closed
            error = error or exc
    if error is not None:
        raise error
