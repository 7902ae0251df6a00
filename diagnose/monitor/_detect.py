"""The alert detector plug-in point: one `Detector` class per alert kind, in a registry.

A detector declares its kind, severity, hint, the `Thresholds` fields it reads (`reads`, or
`defaults` for thresholds of its own, set with Thresholds(extra={...})), and whether a rising
loss makes the lr the first suspect of its symptom (`lr_first`). Its `check(rec, ctx, emit)`
looks at one logged record and the run's shared history (`Context`) and calls `emit` with its
condition; the engine's latch turns a condition that holds into one alert, not one per step.
A `gate` detector (nonfinite) runs first, and when its condition holds the others do not run:
everything downstream of a NaN is NaN.

Robust statistics throughout: a signal's baseline is the median of its last `window` finite
values and its spread the MAD (scaled by 1.4826 to match a standard deviation on normal data,
floored at `mad_floor` x |median| so that a flat history does not turn noise into alerts).
Adding an alert kind is one new Detector subclass passed to `register_detector` (a `Registry`,
diagnose/registry.py); the engine,
the run folder, `diagnose stats` and the report pick its alerts up by their `kind`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
import statistics
from collections import deque
from typing import Any, Callable, ClassVar, Mapping

from ..errors import ConfigError
from ..registry import Registry
from ._divergence import LossTrend

Emit = Callable[..., None]  # emit(condition, where, message, hint=None)


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def layer_values(rec: dict[str, Any], field: str) -> dict[str, float]:
    """{block: rec["layers"][block][field]} for the blocks where that field is a finite number."""
    return {n: st[field] for n, st in (rec.get("layers") or {}).items() if finite(st.get(field))}


def robust_center(values) -> tuple[float, float]:
    """(median, scaled MAD) of a sequence of finite floats."""
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values) * 1.4826
    return med, mad


class Context:
    """What the detectors share about the run: the thresholds, the blocks, per-signal histories,
    streaks of conditions, and the loss trend (pushed before the non-gate detectors run)."""

    def __init__(self, thresholds: Any, blocks: list[str]):
        self.t = thresholds
        self.blocks = blocks
        self.hist: dict[str, deque] = {}
        self.streak: dict[str, int] = {}
        self.calm_max: dict[str, float] = {}  # per signal, the largest value that was not a spike (spike())
        self.trend = LossTrend(thresholds.diverge_window, thresholds.diverge_ratio, thresholds.diverge_floor)
        self.own: dict[str, float] = {}  # the detectors' own thresholds: their defaults, then Thresholds.extra
        for d in DETECTORS:
            self.own.update(d.defaults)
        unknown = sorted(set(getattr(thresholds, "extra", None) or {}) - set(self.own))
        if unknown:
            raise ConfigError(f"Thresholds(extra=...) names {unknown}, which no registered detector reads "
                              f"(their thresholds: {sorted(self.own) or 'none'})")
        self.own.update(getattr(thresholds, "extra", None) or {})

    def threshold(self, name: str) -> float:
        """A Thresholds field, or a detector's own threshold (`defaults`, overridden by Thresholds.extra)."""
        return self.own[name] if name in self.own else getattr(self.t, name)

    def h(self, key: str) -> deque:
        """The recent finite values of signal `key` (at most `window`)."""
        if key not in self.hist:
            self.hist[key] = deque(maxlen=self.t.window)
        return self.hist[key]

    def push(self, key: str, value: Any) -> None:
        if finite(value):
            self.h(key).append(float(value))

    def spike(self, key: str, value: Any, ratio: float, mads: float) -> float | None:
        """value / median when value is a spike against the history of `key`, else None.

        Until the history holds `window` values it is the run's early trajectory, not a settled
        level: from init the loss and the gradient norm fall several-fold within tens of steps (the
        unigram phase fits the token frequencies; qk-normed byte proxy at lr 3e-3: grad norm 1.9 ->
        0.4 by step 22, then 9.9 at step 27 as it leaves that phase, the loss unmoved), so a median
        over it is no baseline. There a spike must also clear `ratio` x the largest value so far
        that was not itself a spike (the proxy's: 4.0, at step 12)."""
        h = self.h(key)
        r = self._spike(h, value, ratio, mads)
        if r is not None and len(h) < self.t.window and value <= ratio * self.calm_max.get(key, 0.0):
            r = None
        if r is None and finite(value):
            self.calm_max[key] = max(self.calm_max.get(key, value), float(value))
        return r

    def _spike(self, h: deque, value: Any, ratio: float, mads: float) -> float | None:
        if not finite(value) or len(h) < self.t.min_history or value <= ratio * min(h):
            return None  # (the median is >= the minimum: no spike possible, no sort needed)
        med, mad = robust_center(h)
        spread = max(mad, self.t.mad_floor * abs(med))
        if med > 0 and value > ratio * med and value > med + mads * spread:
            return value / med
        return None

    def persist(self, key: str, condition: bool, patience: int) -> bool:
        """Whether `condition` has held for `patience` consecutive logged steps."""
        self.streak[key] = self.streak.get(key, 0) + 1 if condition else 0
        return self.streak[key] >= patience


class Detector(ABC):
    """One alert kind. Subclasses set the class attributes and implement check()."""

    kind: ClassVar[str]
    severity: ClassVar[str]  # "warning" or "error"; "info" for an event that is no failure
    hint: ClassVar[str]
    reads: ClassVar[tuple[str, ...]] = ()  # the Thresholds fields check() reads
    defaults: ClassVar[Mapping[str, float]] = {}  # thresholds of its own (Thresholds.extra overrides)
    lr_first: ClassVar[bool] = False  # a rising loss puts "lower the lr" first in its hint
    gate: ClassVar[bool] = False  # when its condition holds, the other detectors do not run
    # judged on every step, logged or not (TrainingMonitor's light steps: loss, lr and grad norm only),
    # so that a spike between logged steps is still caught; the others see logged steps only
    every_step: ClassVar[bool] = False

    @abstractmethod
    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> bool | None:
        """Call emit(condition, where, message, hint=None) once; a gate returns True when it holds."""


def _check(cls: type[Detector]) -> None:
    for attr in ("kind", "severity", "hint"):
        if not isinstance(getattr(cls, attr, None), str):
            raise ConfigError(f"detector {cls.__name__} must set `{attr}` (a string)")
    if cls.severity not in ("info", "warning", "error"):  # info: an event, never a stop (_head_events.py)
        raise ConfigError(f"detector {cls.__name__}: severity must be info, warning or error, got {cls.severity!r}")


def _builtins() -> tuple[type[Detector], ...]:
    from ._builtins import BUILTIN_DETECTORS

    return BUILTIN_DETECTORS


# every detector class by its kind, in the order they are checked (the built-ins first: _builtins.py)
REGISTRY: Registry[type[Detector]] = Registry("alert kind", key=lambda d: d.kind, check=_check, builtins=_builtins)
DETECTORS = REGISTRY  # the older name: iterating it gives the classes


def register_detector(cls: type[Detector]) -> type[Detector]:
    """Add a detector class (usable as a decorator); its kind must be new."""
    return REGISTRY.register(cls)


def unregister_detector(kind: str) -> None:
    """Remove a registered detector (tests, and users who turn a kind off)."""
    REGISTRY.unregister(kind, missing_ok=True)


def kinds() -> tuple[str, ...]:
    """The alert kinds registered now, in the order they are checked."""
    return REGISTRY.names()


def hints() -> dict[str, str]:
    """Each registered kind's default hint."""
    return {d.kind: d.hint for d in DETECTORS}
