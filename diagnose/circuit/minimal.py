"""The minimal circuit: the fewest edges whose circuit (every other edge removed by the method) keeps a
chosen share of the model's performance, and how much that answer holds.

Faithfulness of a circuit C, from per-example summed losses (Wang et al. 2022's normalised form):

    F(C) = (L(empty) - L(C)) / (L(empty) - L(model))

with L(empty) every edge removed and L(model) none. The edges verified by path patching are ranked by
their delta loss (largest first) and kept in that order; the circuit is the shortest prefix with
F >= the target (greedy, as ACDC and EAP's circuits are: the smallest such set is not searched for).
Its interval is a paired bootstrap over examples. Where the data names wrong answers, the same F of the
logit difference label - wrong answer (the sums' signs cancel in the ratio) is reported with its interval;
the circuit is still chosen by the loss. Stability: on each of `resamples` bootstrap
resamples of the examples the edges are ranked again and the prefix chosen again; an edge's inclusion
is the share of resamples whose circuit holds it. Each edge of the circuit also gets its effect inside
the circuit (L(C without it) - L(C), per unit) and the self-repair gap, that minus its effect alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .edges import Edge

RESAMPLES = 20
FIRST = 4  # prefixes per order in the search's first round (then twice as many each round)


@dataclass
class Circuit:
    """The minimal circuit under the main method; `methods` its faithfulness under each other method."""

    edges: list[Edge]
    faithfulness: float | None
    faithfulness_ci: list[float] | None
    target: float
    reached: bool
    resamples: int
    methods: dict[str, dict[str, Any]] = field(default_factory=dict)
    note: str | None = None
    faithfulness_logit_diff: float | None = None  # F of the logit difference (None: no wrong answers named)
    faithfulness_logit_diff_ci: list[float] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"edges": [e.to_json() for e in self.edges], "n_edges": len(self.edges),
                "faithfulness": self.faithfulness, "faithfulness_ci": self.faithfulness_ci, "target": self.target,
                "faithfulness_logit_diff": self.faithfulness_logit_diff,
                "faithfulness_logit_diff_ci": self.faithfulness_logit_diff_ci,
                "reached": self.reached, "resamples": self.resamples, "methods": self.methods, "note": self.note}


# run(kept sets) -> per-example summed loss of the clean model [N] and of each set's circuit [N, M], and the
# same of the logit difference (None, None where the data names no wrong answers)
Run = Callable[[list[frozenset]], tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]]


class Search:
    """Prefix circuits of ranked edges, each evaluated once (cached by its edge set)."""

    def __init__(self, run: Run, n_examples: int):
        self.run, self.cache, self.diff_cache = run, {}, {}
        self.clean = np.zeros(n_examples)
        self.clean_diff: np.ndarray | None = None

    def losses(self, kept: Sequence[frozenset]) -> list[np.ndarray]:
        todo = [k for k in dict.fromkeys(kept) if k not in self.cache]
        if todo:
            self.clean, per, self.clean_diff, diff = self.run(todo)
            self.cache.update({k: per[:, i] for i, k in enumerate(todo)})
            if diff is not None:
                self.diff_cache.update({k: diff[:, i] for i, k in enumerate(todo)})
        return [self.cache[k] for k in kept]

    def logit_diff(self, empty: frozenset, kept: frozenset, n_boot: int, seed: int) -> tuple[float | None, list | None]:
        """F of the logit difference of circuit `kept` and its interval (None, None: no wrong answers named)."""
        self.losses([empty, kept])
        if self.clean_diff is None:
            return None, None
        e, c = self.diff_cache[empty], self.diff_cache[kept]
        f = faithfulness(e, c, self.clean_diff)
        return (f if np.isfinite(f) else None), _ci(e, c, self.clean_diff, n_boot, seed)


def faithfulness(empty: np.ndarray, circuit: np.ndarray, clean: np.ndarray, w: np.ndarray | None = None) -> float:
    """F of one circuit from per-example loss sums [N] (weights w [N]: a bootstrap resample); NaN without a gap."""
    w = np.ones_like(clean) if w is None else w
    gap = float(w @ (empty - clean))
    return float(w @ (empty - circuit)) / gap if abs(gap) > 1e-12 else float("nan")


def prefixes(search: Search, orders: Sequence[Sequence[Edge]], target: float,
             weights: Sequence[np.ndarray | None]) -> list[int]:
    """Per order, the shortest prefix whose F (on its weights) reaches target; len(order) when none does.
    Every order's next prefixes are evaluated together, FIRST, then twice as many each round: one pass over
    the data per round, not per order, and the long prefixes a circuit found early never needs are not run."""
    found: list[int | None] = [None] * len(orders)
    start, size = 1, FIRST
    while any(k is None for k in found):
        stop = start + size
        todo = [i for i, k in enumerate(found) if k is None]
        ks = {i: range(start, min(stop, len(orders[i]) + 1)) for i in todo}
        kept = [frozenset()] + [frozenset(orders[i][:k]) for i in todo for k in ks[i]]
        losses = dict(zip(kept, search.losses(kept)))
        empty = losses[frozenset()]
        for i in todo:
            order, w = orders[i], weights[i]
            k = next((k for k in ks[i] if faithfulness(empty, losses[frozenset(order[:k])], search.clean, w) >= target),
                     None)
            found[i] = k if k is not None else (len(order) if stop > len(order) else None)
        start, size = stop, 2 * size
    return [int(k) for k in found]


def minimal(search: Search, order: Sequence[Edge], per_edge: np.ndarray, target: float, *, resamples: int,
            n_boot: int, seed: int) -> tuple[Circuit, dict[Edge, float]]:
    """The circuit of the ranked `order` and each verified edge's inclusion frequency; per_edge [N, M]: each
    edge's per-example change in loss when removed alone (columns in `order`'s order), for the re-ranking.
    The resamples' circuits are searched together with the main one (prefixes)."""
    n = per_edge.shape[0]
    rng = np.random.default_rng(seed)
    weights = [None] + [rng.multinomial(n, np.full(n, 1.0 / n)).astype(np.float64) for _ in range(resamples)]
    orders = [list(order)] + [[order[j] for j in np.argsort(-(w @ per_edge), kind="stable")] for w in weights[1:]]
    lengths = prefixes(search, orders, target, weights)
    edges = orders[0][:lengths[0]]
    empty, full = search.losses([frozenset(), frozenset(edges)])
    f = faithfulness(empty, full, search.clean)
    ci = _ci(empty, full, search.clean, n_boot, seed)
    counts = dict.fromkeys(order, 0)
    for ranked, k in zip(orders[1:], lengths[1:]):
        for e in ranked[:k]:
            counts[e] += 1
    note = None if np.isfinite(f) else "removing every edge does not change the loss: no faithfulness to keep"
    circuit = Circuit(edges, None if not np.isfinite(f) else f, ci, target, bool(np.isfinite(f) and f >= target),
                      resamples, note=note)
    circuit.faithfulness_logit_diff, circuit.faithfulness_logit_diff_ci = search.logit_diff(
        frozenset(), frozenset(edges), n_boot, seed)
    return circuit, {e: c / max(resamples, 1) for e, c in counts.items()}


def _ci(empty: np.ndarray, circuit: np.ndarray, clean: np.ndarray, n_boot: int, seed: int) -> list[float] | None:
    """95 % percentile interval of F over paired bootstrap resamples of the examples."""
    n = len(clean)
    if n == 0:
        return None
    w = np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(np.float64)  # [R, N]
    gap = w @ (empty - clean)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(np.abs(gap) > 1e-12, (w @ (empty - circuit)) / gap, np.nan)
    if not np.isfinite(f).any():
        return None
    low, high = np.nanpercentile(f, [2.5, 97.5])
    return [float(low), float(high)]


def removed_sets(kept: Sequence[frozenset], edges: Sequence[Edge]) -> torch.Tensor:
    """Each circuit's removed edges as a row over `edges` [M, E] (every edge not kept)."""
    out = torch.ones(len(kept), len(edges), dtype=torch.bool)
    index = {e: i for i, e in enumerate(edges)}
    for m, k in enumerate(kept):
        for e in k:
            out[m, index[e]] = False
    return out
