"""One sweep's results from several ranks, put back together as if one process had run it.

Each rank sweeps a contiguous shard of the batches (rank 0 the first). The per-example
outcomes travel whole and are concatenated in rank order, which is the order of the
examples, so the paired tests, the bootstrap (which resamples examples by index) and the
flags see exactly the arrays one process would. Only sums (KL, the gradient sums of the
--fast estimates, attention statistics) are added up, in rank order, identically on every rank.
"""

from __future__ import annotations

import numpy as np

from .._distributed import Ranks
from .accumulate import Accumulator

_SUMMED = ("kl", "michel", "linear", "fisher")  # np.ndarray [M] sums over examples
_LISTED = ("loss_sum", "correct", "count", "ab_loss", "ab_correct")  # one array per batch, in batch order


def merge(acc: Accumulator, r: Ranks) -> Accumulator:
    """Every rank's Accumulator as one, the same on every rank (acc itself when alone)."""
    if not r.active:
        return acc
    parts = r.gather(acc)
    out = Accumulator(acc.n_heads)
    for part in parts:  # rank order = example order
        for name in _LISTED:
            getattr(out, name).extend(getattr(part, name))
        for name in _SUMMED:
            setattr(out, name, getattr(out, name) + getattr(part, name))
        out.n_scored_examples += part.n_scored_examples
    return out


def merge_stats(parts: list[tuple[list[dict[str, list[float]]], list[list[float]]] | None]) -> list[dict]:
    """Per-site attention statistics over all shards from each shard's (means, rows): each mean times
    its rows is that shard's sum (prev_token and next_token count their own rows, see HeadStats)."""
    from ..attention_stats import STATS

    shares = [p for p in parts if p is not None]
    n_sites = len(shares[0][0])
    out = []
    for s in range(n_sites):
        site: dict[str, list[float]] = {}
        for k in STATS:
            i = {"prev_token": 1, "next_token": 2}.get(k, 0)
            rows = sum(rows_[s][i] for _, rows_ in shares)
            n_heads = len(shares[0][0][s][k])
            if not any(rows_[s][0] > 0 for _, rows_ in shares):
                site[k] = list(shares[0][0][s][k])  # no rows anywhere: what one process reports
                continue
            total = np.zeros(n_heads)
            for stats, rows_ in shares:
                if rows_[s][i] > 0:
                    total += np.asarray(stats[s][k], dtype=float) * rows_[s][i]
            site[k] = (total / max(rows, 1.0)).tolist()
        out.append(site)
    return out

