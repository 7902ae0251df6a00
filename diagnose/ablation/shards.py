"""One sweep's results from several ranks, put back together as if one process had run it.

Each rank sweeps a contiguous shard of the batches (rank 0 the first). The per-example
outcomes travel whole and are concatenated in rank order, which is the order of the
examples, so the paired tests, the bootstrap (which resamples examples by index) and the
flags see exactly the arrays one process would. Only sums (KL, the gradient sums of the
--fast estimates, attention statistics) are added up, in rank order, identically on every rank.
"""

from __future__ import annotations


from .._distributed import Ranks
from ..attention_stats import HeadStats
from .accumulate import Accumulator

_SUMMED = ("kl", "michel", "linear", "fisher")  # np.ndarray [M] sums over examples
_LISTED = ("loss_sum", "correct", "count", "ab_loss", "ab_correct", "diff", "diff_count", "ab_diff")  # one array per batch, in batch order


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


def merge_stats(parts: list[list[HeadStats] | None]) -> list[dict[str, list[float]]]:
    """Per-site attention statistics over all shards, from each shard's per-site HeadStats (None: a
    rank with no batches): their raw sums and named counts added up, in rank order (HeadStats.merge)."""
    shares = [p for p in parts if p is not None]
    return [HeadStats.merge(site).result() for site in zip(*shares)]
