"""Alerts: the engine that feeds each logged step through every registered detector.

The detectors are one class per alert kind (_detect.py holds the plug-in point, _detect_*.py the
built-in kinds, _builtins.py their order). Every kind fires once, then stays quiet until its
condition has cleared and `cooldown` steps have passed: a run that stays broken produces one
alert, not one per step. While the loss is rising away from its best (_divergence.py), the hints
of `lr_first` kinds say "lower the lr" first.
"""

from __future__ import annotations

import math
import numbers
import operator
import sys
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from .._numbers import number
from ..errors import ConfigError

from ._detect import DETECTORS, Context, Detector, hints, kinds
from ._divergence import evidence_first

__all__ = ["AlertEngine", "Thresholds", "format_alert", "print_alert", "kinds", "hints"]


@dataclass
class Thresholds:
    """When each alert fires. Ratios are relative to the run's own recent history.

    window / min_history: steps of history kept per signal, and needed before spike checks;
        until a history holds `window` values, spikes and growth are judged against the run's
        early trajectory (_detect.Context.spike, _detect_layers.ActivationGrowth).
    mad_floor: the spread is at least this fraction of |median| (flat histories).
    grad_spike_ratio / grad_spike_mads: global grad norm above ratio x median AND above
        median + mads x MAD.  loss_spike_ratio / loss_spike_mads: the same for the loss.
    vanishing_ratio / vanishing_patience: the smallest block grad norm below ratio x the largest
        for `patience` consecutive logged steps.
    loss_spike_floor: a loss spike must also rise by this fraction of the first logged loss
        (late in a run, 0.004 -> 0.04 is 10x but means nothing).
    diverge_window / diverge_ratio / diverge_floor / diverge_patience: divergence fires when the
        median of the last `window` logged losses has stayed above `ratio` x the run's best such median
        (and above it by `floor` x the first logged loss) for `patience` consecutive logged steps
        (see _divergence.py). Measured: lr 1.0 on the reference model fires 6 steps after the loss
        doubled, in the steep and in the slow scenario of tests/monitor/test_failures.py; no healthy
        or otherwise broken run of that suite trips it.
    grad_spike_floor: likewise, a gradient spike must reach this fraction of the first logged
        grad norm (a converged demo classifier went 0.0012 -> 0.0100: 8x, and nothing to act on).
    growth_ratio: a block's activation variance above growth_ratio x its median over the window.
    collapse_entropy_frac / collapse_head_frac: a site where at least collapse_head_frac of the
        heads have an attention entropy below collapse_entropy_frac x their entropy at the
        first sample (learned sharp heads keep ~20 % of it; collapsed ones drop under 5 %).
    init_entropy_frac: at a site's first attention sample, at least collapse_head_frac of the heads
        below init_entropy_frac x the entropy of uniform attention over the visible keys (log of
        their count, causal and padding masks included) is a collapse from initialisation, which
        the comparison with the first sample cannot see. Fresh heads sit near uniform (ratio ~0.9
        and above); a 128-wide head without 1/sqrt(d_k) measured 0.79 nats against 2.2 (0.36).
        The heads must also be alike (within `init_head_spread`, 2x, of each other: Thresholds(extra=)):
        fresh heads are exchangeable, trained ones sharp beside broad, so a pretrained start is judged
        against its first sample only; one whose heads are all alike and sharp may set this to 0.
    rank_cos / rank_patience: a block's mean cosine similarity between positions at least
        rank_cos for `patience` consecutive logged steps, in any block but the last. Measured: true
        collapse (a stack without residuals, lr 0.1) reaches 0.99-1.00 and stays; healthy runs stay
        below: a Post-LN run with warmup at lr 1e-2 peaked at 0.93, and the first block of the
        demo's 2-layer order and padding classifiers, which broadcast one token to every position,
        held 0.975 and 0.953 while reaching 100 % accuracy. A block that rose to rank_cos during
        training (the unigram phase, see _detect_layers.RankCollapse) must hold it `rank_grace`
        (50, Thresholds(extra=)) logged steps instead of rank_patience.
    warmup_check: no_warmup fires when the lr of the second logged step (within this many
        steps of the first) is not above the first; False disables it.
    cooldown: steps before the same kind may fire again (after its condition cleared).
    extra: thresholds of registered detectors that are not built in ({name: value}, overriding
        their `defaults`); a name no registered detector reads is refused.
    Each value is checked when the Thresholds is made (ConfigError naming it): a finite number, 0 or
    more; a whole one from 0 to 2**63 - 1 where it counts steps (an int field, or an extra whose
    detector's default is an int); numpy's numbers are kept as Python's.
    """

    window: int = 50
    min_history: int = 8
    mad_floor: float = 0.05
    grad_spike_ratio: float = 4.0
    grad_spike_mads: float = 8.0
    loss_spike_ratio: float = 1.5
    loss_spike_mads: float = 8.0
    vanishing_ratio: float = 1e-3
    vanishing_patience: int = 3
    growth_ratio: float = 100.0
    collapse_entropy_frac: float = 0.1
    collapse_head_frac: float = 0.75
    init_entropy_frac: float = 0.5
    loss_spike_floor: float = 0.05
    grad_spike_floor: float = 0.05
    diverge_window: int = 5
    diverge_ratio: float = 2.0
    diverge_floor: float = 0.25
    diverge_patience: int = 5
    rank_cos: float = 0.99
    rank_patience: int = 5
    warmup_check: int | bool = 100
    cooldown: int = 100
    extra: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Every value checked now, not at the first step that reads it: a finite number, 0 or more
        (a whole number where the field counts steps; warmup_check may also be False); ConfigError."""
        for f in fields(self):
            if f.name != "extra":
                setattr(self, f.name, _check_threshold(f.name, getattr(self, f.name), whole=f.type.startswith("int"),
                                                       flag=f.name == "warmup_check"))
        if self.window < 1:
            raise ConfigError(f"Thresholds(window=...) must be at least 1, got {self.window}")
        if not isinstance(self.extra, Mapping):
            raise ConfigError(f"Thresholds(extra=...) must be a dict {{name: number}}, got {type(self.extra).__name__}")
        extra = {}
        for name, value in self.extra.items():
            if not isinstance(name, str):
                raise ConfigError(f"Thresholds(extra=...) names must be strings, got {name!r:.40}")
            extra[name] = _check_threshold(name, value, whole=_counts_steps(name), flag=False, where="extra")
        self.extra = extra

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if not out["extra"]:
            del out["extra"]  # run.json as before when no plug-in threshold is set
        return out



MAX_COUNT = 2 ** 63 - 1  # a threshold that counts steps counts them as a step is numbered: an int64


def _counts_steps(name: str) -> bool:
    """Whether a detector's own threshold counts steps: its default (Detector.defaults) is a whole number."""
    for d in DETECTORS:
        default = (getattr(d, "defaults", None) or {}).get(name)
        if default is not None:
            return isinstance(default, int) and not isinstance(default, bool)
    return False  # no registered detector reads it (yet): refused, by name, when a monitor is made


def _check_threshold(name: str, value: Any, *, whole: bool, flag: bool, where: str = "") -> Any:
    """The value as it is kept: a Python int where it counts steps (0 to 2**63 - 1), else a finite
    number, 0 or more (numpy's numbers become Python's); ConfigError naming the field otherwise."""
    shown = f"Thresholds(extra={{{name!r}: ...}})" if where else f"Thresholds({name}=...)"
    if flag and isinstance(value, bool):
        return value
    want = "a whole number (it counts steps)" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's numbers are Real too
        raise ConfigError(f"{shown} must be {want}, got {type(value).__name__} {value!r:.40}")
    if whole and not isinstance(value, numbers.Integral):
        raise ConfigError(f"{shown} must be {want}, got {value!r:.40}")
    if whole:
        value = operator.index(value)
        if not 0 <= value <= MAX_COUNT:
            raise ConfigError(f"{shown} counts steps: a whole number, 0 or more and at most 2**63 - 1, got {value!r:.40}")
        return value
    x = number(value) if isinstance(value, (int, float)) else float(value)
    if x is None or not (math.isfinite(x) and x >= 0):
        raise ConfigError(f"{shown} must be a finite number, 0 or more, got {value!r:.40}")
    return value if isinstance(value, (int, float)) else x


class _Latch:
    """De-duplication of one alert kind: fire once, re-arm after the condition clears and
    `cooldown` steps have passed. (Not the ablation's head gate.)"""

    def __init__(self, cooldown: int):
        self.cooldown, self.active, self.last = cooldown, False, None

    def __call__(self, condition: bool, step: int) -> bool:
        if not condition:
            self.active = False
            return False
        if self.active or (self.last is not None and step - self.last < self.cooldown):
            return False
        self.active, self.last = True, step
        return True


class AlertEngine:
    """Feeds each logged record through every registered detector; returns the alerts it raises."""

    def __init__(self, thresholds: Thresholds, blocks: list[str]):
        self.t = thresholds
        self.ctx = Context(thresholds, blocks)
        self.detectors: list[Detector] = [cls() for cls in DETECTORS]
        self.latches = {d.kind: _Latch(thresholds.cooldown) for d in self.detectors}

    def check(self, rec: dict[str, Any], *, amp: bool = False, light: bool = False) -> list[dict[str, Any]]:
        """Alerts for this record; the record's values then join the history.

        light: a step between logged steps ({step, loss, lr, grad_norm} only): only the detectors
        judged on every step (`Detector.every_step`) see it; the loss trend takes every step's loss."""
        out: list[dict[str, Any]] = []
        self.ctx.amp = amp
        run = [d for d in self.detectors if d.every_step] if light else self.detectors
        for d in run:
            if d.gate and d.check(rec, self.ctx, self._emitter(d, rec, out)):
                return out  # everything downstream of a NaN is NaN: other detectors would only echo it
        self.ctx.trend.push(rec["step"], rec.get("loss"))  # before the others: their hints depend on it
        for d in run:
            if not d.gate:
                d.check(rec, self.ctx, self._emitter(d, rec, out))
        return out

    def _emitter(self, d: Detector, rec: dict[str, Any], out: list[dict[str, Any]]):
        step, trend = rec["step"], self.ctx.trend

        def emit(condition: bool, where: str, message: str, hint: str | None = None) -> None:
            # an info event (a head's own change) is not latched: its detector says each change once
            if (condition and d.severity == "info") or self.latches[d.kind](condition, step):
                hint = hint or d.hint
                if d.lr_first and trend.rising:
                    hint = evidence_first(hint, trend, rec.get("lr"))
                out.append({"step": step, "kind": d.kind, "severity": d.severity, "where": where,
                            "message": message, "hint": hint})
        return emit


def format_alert(alert: dict[str, Any]) -> str:
    """One alert as two lines of text: what and where, then the hint."""
    return (f"diagnose [{alert['severity']}] step {alert['step']} {alert['kind']} at {alert['where']}: "
            f"{alert['message']}\n  hint: {alert['hint']}")


def print_alert(alert: dict[str, Any]) -> None:
    print(format_alert(alert), file=sys.stderr, flush=True)
