"""Slow divergence: the loss climbing away from its best, which the spike detectors cannot see.

A spike is judged against the recent median, and in a run that diverges over tens of steps the
median climbs with the loss (measured: lr 1.0 on the reference model took the loss from 3.5 to
109 in 18 steps without a loss_spike). The trend here is judged against the run's best instead:

    smoothed(t) = median of the last `diverge_window` finite logged losses (fewer at the start)
    best(t)     = min of smoothed up to t   (the run's best, robust to one lucky batch)
    rising(t)   = smoothed - best > (diverge_ratio - 1) x |best|
                  and smoothed - best > diverge_floor x |first logged loss|

`divergence` fires when `rising` has held for `diverge_patience` consecutive logged steps. The
floor keeps a converged run's noise quiet (0.005 -> 0.02 is 4x, but nothing on a run that
started at 3.0). While `rising` holds, the hints of the other kinds say "lower the lr" first:
when the loss is running away, the step size is the first suspect, whatever symptom fired.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any


class LossTrend:
    """The smoothed loss, its best so far, and whether it is rising away from it."""

    def __init__(self, window: int, ratio: float, floor: float):
        self.recent: deque[float] = deque(maxlen=max(1, window))
        self.ratio, self.floor = ratio, floor
        self.first: float | None = None
        self.best: float | None = None
        self.best_step: int | None = None
        self.smoothed: float | None = None

    def push(self, step: int, loss: Any) -> None:
        if not isinstance(loss, (int, float)) or not math.isfinite(loss):
            return
        loss = float(loss)
        if self.first is None:
            self.first = loss
        self.recent.append(loss)
        self.smoothed = statistics.median(self.recent)
        if self.best is None or self.smoothed < self.best:
            self.best, self.best_step = self.smoothed, step

    @property
    def rising(self) -> bool:
        if self.smoothed is None or self.best is None or self.first is None:
            return False
        rise = self.smoothed - self.best
        return rise > (self.ratio - 1.0) * abs(self.best) and rise > self.floor * abs(self.first)

    def describe(self) -> str:
        """'3.52 (step 0) -> 9.04': the best and where it was, then the smoothed loss now."""
        return f"{self.best:.4g} (step {self.best_step}) -> {self.smoothed:.4g}"


def _lr_text(lr: Any) -> str:
    return f" (it is {lr:.3g} now)" if isinstance(lr, (int, float)) and math.isfinite(lr) else ""


def divergence_hint(lr: Any, clipping: bool) -> str:
    """Lower the lr first; clipping second, or, when the loop clips, that it did not hold."""
    clip = ("the loop already clips, and clipping bounds each update but not the lr's share of it"
            if clipping else "then clip gradients (torch.nn.utils.clip_grad_norm_(params, 1.0))")
    return (f"lower the lr first, 3-10x{_lr_text(lr)}; {clip}; add or lengthen the warmup; resume from "
            "a checkpoint before the rise. If it diverges at a small lr too, look for a bad data shard, "
            "and, only if the blocks are Post-LN (x = norm(x + f(x))), move to Pre-LN")


def evidence_first(hint: str, trend: LossTrend, lr: Any) -> str:
    """Another kind's hint, led by what the rising loss points to."""
    return f"the loss is rising ({trend.describe()}): lower the lr first{_lr_text(lr)}; then: {hint}"
