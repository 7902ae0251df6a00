"""Prune's view of the one ablation engine: the heads removed so far are the base `closed` heads of a
`Sweep`, each round is the ranked way through it (ablation/steps.py: the --fast estimate from the
accumulator, then the candidates ablated exactly), and the micro-batches and heads per forward come from
the sweep's own plan (ablation/plan.py). `closed` is a list of (site, head) pairs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from .._distributed import Ranks
from ..ablation.gate import Gate
from ..ablation.plan import micro_batches, plan_sweep
from ..ablation.steps import indexed, ranked_heads
from ..ablation.sweep import Sweep
from ..adapters.base import AttentionSite
from ..objectives import require_finite


@dataclass
class Measured:
    """Sums over the data with one set of heads closed."""

    loss_sum: float
    correct: float
    units: float

    @property
    def accuracy(self) -> float:
        return self.correct / max(self.units, 1.0)

    @property
    def loss(self) -> float:
        return self.loss_sum / max(self.units, 1.0)


# pick(estimate) -> the (site, head) pairs to measure exactly; estimate: per site [H], the second-order change
# of the mean loss if each head were closed on top of the closed ones
Pick = Callable[[list[np.ndarray]], list[tuple[int, int]]]


class Measure:
    """Forwards through the gates of `sites`, planned once for `batches`; `forwards` counts them."""

    def __init__(self, model: torch.nn.Module, sites: Sequence[AttentionSite], batches: Sequence[tuple[Any, Any]],
                 task: str):
        self.plan = plan_sweep(model, sites, batches)
        self.parts = micro_batches(batches, self.plan.micro_batch)
        self.model, self.sites, self.task = model, list(sites), task
        self.forwards = 0

    def sweep(self, gates: Sequence[Gate], closed: Sequence[tuple[int, int]]) -> Sweep:
        """A sweep over `gates` with `closed` shut in every pass."""
        return Sweep(self.model, self.sites, gates, self.task, replication=self.plan.replication, closed=closed)

    def clean(self, sweep: Sweep) -> Iterator[Any]:
        """The sweep's clean pass (its closed heads shut) of each part, without gradients."""
        for inputs, labels, rows in indexed(self.parts, 0):
            before = sweep.forwards
            yield sweep.clean(inputs, labels, grad=False, record=False, rows=rows)
            self.forwards += sweep.forwards - before

    def measured(self, sweep: Sweep) -> Measured:
        """Sums over the data with the sweep's closed heads shut."""
        sums = [0.0, 0.0, 0.0]
        for c in self.clean(sweep):
            sums = [sums[0] + float(c.loss_sum.sum()), sums[1] + float(c.correct.sum()), sums[2] + float(c.count.sum())]
        return Measured(*sums)

    def per_example(self, sweep: Sweep) -> np.ndarray:
        """Per-example accuracy (correct / scored units) with the sweep's closed heads shut.  # [N]"""
        return np.concatenate([(c.correct / c.count.clamp_min(1)).double().cpu().numpy() for c in self.clean(sweep)])

    def round(self, sweep: Sweep, pick: Pick) -> list[tuple[tuple[int, int], Measured]]:
        """One round: the estimate for every head, `pick` chooses, each chosen head is ablated exactly on
        top of the sweep's closed ones; returns (site, head) and its Measured, in pick's order."""
        index = {pair: m for m, pair in enumerate(sweep.heads)}
        picked: list[tuple[int, int]] = []

        def choose(acc) -> list[int]:
            flat = acc.second_order_delta_loss()  # [M] in the sweep's global order
            est = [np.array([flat[index[(s, h)]] for h in range(site.n_heads)]) for s, site in enumerate(self.sites)]
            picked.extend(pick(est))
            return [index[pair] for pair in picked]

        before = sweep.forwards
        acc, chosen = ranked_heads(sweep, self.parts, 0, Ranks(), choose)
        self.forwards += sweep.forwards - before
        _, _, count, ab_loss, ab_correct = acc.arrays()
        if not np.isfinite(ab_loss[:, chosen]).all():
            require_finite(self.model, torch.tensor(ab_loss[:, chosen]), "with heads closed")
        units = float(count.sum())
        return [(pair, Measured(float(ab_loss[:, m].sum()), float(ab_correct[:, m].sum()), units))
                for pair, m in zip(picked, chosen)]
