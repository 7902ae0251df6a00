"""The circuit under torch.distributed: each rank measures a contiguous shard of the batches, as the heads'
sweep does (ablation/engine.py), and every rank gets the result one process would.

What travels: the methods' data passes add up their sums (DataPass.reduce, in rank order); the edge
attribution's scores and units are added up in rank order; every patched pass's per-example outcomes
travel whole and are joined in rank order, which is the order of the examples, so the paired tests, the
bootstraps and the minimal circuit's search see the arrays one process would and decide the same on
every rank (each rank runs the same search, so the collectives match). Work that may fail on one rank
runs in `Ranks.run_local`: the others raise, none is left waiting.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .._distributed import Ranks, pick
from ..ablation.steps import first_example
from .patch import Measured, Patcher, over_data


@dataclass(frozen=True)
class Shard:
    """This rank's share of the batches (all of them when alone) and `first`, the data set's index of its
    first example."""

    ranks: Ranks
    batches: Sequence[tuple[Any, Any]]
    first: int

    @classmethod
    def of(cls, batches: Sequence[tuple[Any, Any]], r: Ranks) -> "Shard":
        return cls(r, pick(batches, r), first_example(batches, r))

    def reduce(self, device) -> Callable[[list, list], tuple[list, list]] | None:
        """Sums over the ranks (a method's data pass, the attribution), None when alone."""
        return (lambda tensors, numbers: self.ranks.add_up(tensors, numbers, device)) if self.ranks.active else None

    def over_data(self, patcher: Patcher, parts: Sequence[tuple[Any, Any]], sets: torch.Tensor) -> Measured:
        """over_data on this rank's `parts` (its shard, in micro-batches), every rank's joined in example order."""
        mine = self.ranks.run_local("path patching", lambda: over_data(patcher, parts, sets, self.first)
                                    if len(parts) else None)
        if not self.ranks.active:
            return mine
        got = [m for m in self.ranks.gather(mine) if m is not None]
        return Measured(*[None if getattr(got[0], f.name) is None else
                          np.concatenate([getattr(m, f.name) for m in got]) for f in fields(Measured)])
