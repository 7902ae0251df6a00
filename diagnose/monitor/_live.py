"""Live sinks: stream the monitor's scalars and alerts into a tracker the user already has open.

A `LiveSink` flattens each step record into scalars named under `diagnose/` (the same names as
Run.steps: `diagnose/loss`, `diagnose/layers/<block>/act_var`, `diagnose/attention/<site>/entropy/
head0`), each alert into a `diagnose/alerts/<kind>` scalar (1 a warning, 2 an error) and, where the
tracker shows text, its message and hint under `diagnose/alert_text/<kind>`; evaluations go under
`diagnose/eval/<name>`. The run folder stays the source of truth: a live sink is one more copy,
for watching. The trackers' subclasses are in _live_trackers.py; here is the base and the plain
callable.
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from typing import Any, Callable

from ..errors import UsageError
from . import _fields
from ._head_events import head_scalars
from ._sinks import Sink

PREFIX = "diagnose/"
SEVERITY = {"info": 0.0, "warning": 1.0, "error": 2.0}  # an alert's scalar (info: a head event, no failure)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def flatten(record: dict[str, Any], prefix: str = PREFIX) -> dict[str, float]:
    """Every number of a step record by its path, `/`-joined under `prefix`; null (None) left out:
    the one flattener of the run readers (_fields.flatten), with the fields declared for sinks.
    A list at an attention site (one number per head) ends in `/head<h>`."""
    return _fields.flatten(record, prefix, place="sink")


def alert_scalar(alert: dict[str, Any], prefix: str = PREFIX) -> dict[str, float]:
    """{`diagnose/alerts/<kind>`: 0 (an info event), 1 (warning) or 2 (error)}."""
    return {f"{prefix}alerts/{alert.get('kind')}": SEVERITY.get(alert.get("severity"), 1.0)}


def alert_text(alert: dict[str, Any]) -> str:
    """One alert as a line of text: where, message and hint."""
    return f"step {alert.get('step')}: {alert.get('where')}: {alert.get('message')} (hint: {alert.get('hint')})"


def eval_scalars(record: dict[str, Any], prefix: str = PREFIX) -> dict[str, float]:
    """An evaluation record's loss and metrics under `diagnose/eval/`."""
    out = {f"{prefix}eval/loss": float(record["loss"])} if _number(record.get("loss")) else {}
    for k, v in (record.get("metrics") or {}).items():
        if _number(v):
            out[f"{prefix}eval/{k}"] = float(v)
    return out


class LiveSink(Sink, ABC):
    """Base of the live sinks: subclasses write scalars (`log`) and, optionally, text (`text`);
    one that forgets `log` fails when it is made (an abstract method, as Detector.check)."""

    prefix = PREFIX

    @abstractmethod
    def log(self, scalars: dict[str, float], step: int) -> None:
        """Write these scalars at this step (the tracker's own call)."""

    def text(self, tag: str, text: str, step: int) -> None:
        """Write a line of text (alerts); trackers without text ignore it."""

    def step(self, record: dict[str, Any]) -> None:
        self.log({**flatten(record, self.prefix), **head_scalars(record, self.prefix)}, int(record["step"]))

    def alert(self, alert: dict[str, Any]) -> None:
        step = int(alert.get("step") or 0)
        self.log(alert_scalar(alert, self.prefix), step)
        self.text(f"{self.prefix}alert_text/{alert.get('kind')}", alert_text(alert), step)

    def eval(self, record: dict[str, Any]) -> None:
        scalars = eval_scalars(record, self.prefix)
        if scalars:
            self.log(scalars, int(record["step"]))


class CallableSink(LiveSink):
    """fn(scalars, step) for each logged step, alert and evaluation: scalars {name: float} under
    `diagnose/` (NaN kept: a non-finite loss is the news). A plain function passed in
    TrainingMonitor(sinks=[fn]) is wrapped in one."""

    def __init__(self, fn: Callable[[dict[str, float], int], Any]):
        try:
            inspect.signature(fn).bind({}, 0)
        except TypeError:  # it could not take (scalars, step): every call would fail, so refuse it now
            name = getattr(fn, "__qualname__", type(fn).__name__)
            raise UsageError(f"sink function {name} cannot be called as f(scalars, step): give it two "
                             f"parameters, or pass a diagnose.monitor.Sink") from None
        except ValueError:  # a builtin without a signature: tried at the first step, as a guest
            pass
        self.fn = fn

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.fn(scalars, step)


def finite_or_none(v: float) -> float | None:
    """v, or None when it is NaN or infinite (for trackers that refuse them)."""
    return v if math.isfinite(v) else None
