"""The choice: which heads go, one at a time, re-measured after every removal.

Each round ranks the heads still open by the cheap second-order estimate (the `--fast` one,
taken with the heads already removed closed), verifies the `candidates` best ones exactly
through the same head gate, and removes the one whose removal costs the least loss among those
that keep the model within budget. Re-measuring after each removal is what stops a group of
heads that matter only together from being removed one by one into a cliff: each removal is
judged against the original model with every earlier removal in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..ablation.gate import Gate
from ._measure import Measure, Measured


@dataclass
class Budget:
    """How much may be lost against the unpruned model: accuracy points (max_drop), loss (max_loss)."""

    max_drop: float | None
    max_loss: float | None

    def allows(self, base: Measured, now: Measured) -> bool:
        if self.max_drop is not None and (base.accuracy - now.accuracy) * 100.0 > self.max_drop + 1e-9:
            return False
        return self.max_loss is None or now.loss - base.loss <= self.max_loss + 1e-12


@dataclass
class Step:
    """One removal, with the model measured on the choice data after it."""

    layer: int
    head: int
    accuracy: float
    loss: float
    estimate: float  # the second-order estimate of the loss change that ranked it
    n_removed: int


@dataclass
class Choice:
    """Every removal accepted, in order (all `kept`, unless the caller trims the choice)."""

    baseline: Measured
    n_heads: list[int]  # per layer, before pruning
    steps: list[Step] = field(default_factory=list)
    kept: int = 0
    stop: dict[str, Any] = field(default_factory=dict)
    rounds: int = 0

    def removed(self) -> list[tuple[int, int]]:
        return [(s.layer, s.head) for s in self.steps[:self.kept]]

    def heads_left(self) -> list[int]:
        left = list(self.n_heads)
        for layer, _ in self.removed():
            left[layer] -= 1
        return left


def choose(measure: Measure, gates: Sequence[Gate], budget: Budget, *, candidates: int = 4, min_heads: int = 0,
           limit: int | None = None, on_step: Callable[[Step | None, Choice], None] | None = None) -> Choice:
    """Remove heads greedily until one more would break `budget` (see the module docstring).

    min_heads: heads every layer keeps (1 where the family cannot build a layer without attention).
    limit: at most this many removals.
    """
    n_heads = [site.n_heads for site in measure.sites]
    closed: list[tuple[int, int]] = []  # (site, head), in the order removed
    choice = Choice(baseline=measure.measured(measure.sweep(gates, closed)), n_heads=n_heads)
    while True:
        left = [n - sum(1 for s, _ in closed if s == site) for site, n in enumerate(n_heads)]
        layers = [s for s, n in enumerate(left) if n > min_heads]
        if not layers:
            choice.stop = {"reason": f"every layer is down to {min_heads} head(s)"}
            break
        if limit is not None and len(choice.steps) >= limit:
            choice.stop = {"reason": f"the limit of {limit} removals was reached"}
            break
        estimates: dict[tuple[int, int], float] = {}

        def pick(est: list) -> list[tuple[int, int]]:
            pool = sorted((float(est[s][h]), s, h) for s in layers for h in range(n_heads[s]) if (s, h) not in closed)
            estimates.update({(s, h): e for e, s, h in pool})
            return [(s, h) for _, s, h in pool[:max(1, int(candidates))]]

        measured = measure.round(measure.sweep(gates, closed), pick)
        choice.rounds += 1
        ok = [(m.loss, i) for i, (_, m) in enumerate(measured) if budget.allows(choice.baseline, m)]
        if not ok:
            best = min(range(len(measured)), key=lambda i: measured[i][1].loss)
            (s, h), m = measured[best]
            choice.stop = {"reason": "removing one more head would exceed the budget",
                           "next": {"layer": s, "head": h, "accuracy": m.accuracy, "loss": m.loss}}
            break
        (s, h), m = measured[min(ok)[1]]
        closed.append((s, h))
        step = Step(s, h, m.accuracy, m.loss, estimates[(s, h)], len(choice.steps) + 1)
        choice.steps.append(step)
        if on_step is not None:
            on_step(step, choice)
    choice.kept = len(choice.steps)
    return choice
