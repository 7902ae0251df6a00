"""The statistics registry (diagnose/statistics.py): what an entry must say, a statistic that reads
token ids through the batch context, and HeadStats.merge on raw sums with named counts."""

from __future__ import annotations

import math

import pytest
import torch

from diagnose.attention_stats import HeadStats
from diagnose.errors import ConfigError
from diagnose.stat_context import BatchContext
from diagnose.statistics import ATTENTION_STATS, DENOMINATORS, STATISTICS, Statistic, register, shown, unregister
from .tolerance import approx

pytestmark = pytest.mark.numerics

T = 6


def same_token(c):
    """Mass on earlier keys that hold the query's own token (a duplicate-token head's signature)."""
    q, k = c.query_ids, c.key_ids  # [B, c], [B, K]
    same = (q[:, :, None] == k[:, None, :]) & (c.k_pos[None, None, :] < c.q_pos[None, :, None])  # [B, c, K]
    return (c.p * same[:, None].float()).sum(-1)  # [B, H, c]


TOY = Statistic("same_token", "mass on an earlier copy of its token", "same tok", same_token, needs_tokens=True,
                show=frozenset({"cli", "table", "grid", "scatter"}))


@pytest.fixture
def toy():
    """TOY registered for one test, then removed, so the registry is as shipped for every other test."""
    register(TOY)
    try:
        yield TOY
    finally:
        unregister(TOY.name)


def test_entries_are_checked_when_registered():
    with pytest.raises(ConfigError, match="already registered"):
        register(STATISTICS["entropy"])
    with pytest.raises(ConfigError, match="denominator"):
        register(Statistic("x", "x", "x", lambda c: c.zeros(), denominator="odd_rows"))
    with pytest.raises(ConfigError, match="wall"):
        register(Statistic("x", "x", "x", lambda c: c.zeros(), show=frozenset({"wall"})))
    assert "x" not in STATISTICS
    assert {s.denominator for s in STATISTICS.values()} <= set(DENOMINATORS)


def test_the_shipped_places_and_order():
    """What each table and plot showed before the registry, now read from it."""
    assert tuple(ATTENTION_STATS) == ("entropy", "max_weight", "first_token", "self", "prev_token", "padding",
                                      "mean_distance", "next_token", "last_token", "local", "duplicate_token",
                                      "induction")
    assert [s.name for s in shown("cli")] == [s.name for s in shown("table")] == ["entropy", "max_weight",
                                                                                   "first_token"]
    assert [s.name for s in shown("effect_grid")] == ["max_weight"]
    assert [s.name for s in shown("grid")] == ["entropy", "first_token", "self", "prev_token", "induction"]
    assert {s.name for s in shown("scatter")} == {"entropy", "max_weight", "first_token"}


def test_a_registered_statistic_reads_token_ids_from_the_batch_context(toy):
    ids = torch.tensor([[5, 7, 5, 7, 5, 9]])  # [1, T]
    probs = torch.zeros(1, 2, T, T)  # [B, H, Tq, Tk]
    for q in range(T):
        probs[0, 0, q, max(q - 2, 0)] = 1.0  # head 0: two back (a copy of the token from q = 2 to 4)
        probs[0, 1, q, q] = 1.0  # head 1: itself, never an earlier copy
    acc = HeadStats(2)
    acc.update(probs, batch=BatchContext.of({"input_ids": ids}))
    got = acc.result()
    assert list(got) == list(ATTENTION_STATS) and "same_token" in got
    assert got["same_token"] == approx([3 / T, 0.0], scale=1.0, width=probs.numel())
    assert got["self"] == approx([1 / T, 1.0], scale=1.0, width=probs.numel())  # the built-ins as before
    blind = HeadStats(2)
    blind.update(probs)  # no token ids: the statistic that needs them says so with NaN, the others do not
    assert all(math.isnan(x) for x in blind.result()["same_token"])
    assert blind.result()["self"] == got["self"]


def test_merge_adds_raw_sums_and_named_counts():
    """Shards merged equal one accumulator fed every batch, including a shard without rows that
    have a previous position (one query) and padded rows (which count nowhere)."""
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(5, 3, T, T), -1)
    mask = torch.ones(5, T)
    mask[1, 3:] = 0
    whole = HeadStats(3)
    whole.update(probs, mask)
    shards = [HeadStats(3), HeadStats(3), HeadStats(3), HeadStats(3)]
    shards[0].update(probs[:2], mask[:2])
    shards[1].update(probs[2:], mask[2:])
    shards[2].update(probs[:, :, -1:], mask)  # last query only: every row has a previous, none a next
    merged = HeadStats.merge(shards[:2] + [shards[3]])  # shards[3] saw nothing
    assert set(merged.counts) == {"rows", "with_prev", "with_next", "with_duplicate", "with_induction_target"}
    assert merged.counts["rows"].item() == whole.counts["rows"].item() == 5 * T - 3
    for k, v in whole.result().items():
        assert merged.result()[k] == approx(v, scale=T, width=probs.numel()), k
    assert shards[2].counts["with_next"].item() == 0 and shards[2].counts["with_prev"].item() == 4  # example 1's last row is padding
    again = HeadStats.merge([shards[2], shards[2]])
    for k, v in shards[2].result().items():  # a mean over no rows stays what one accumulator says (0)
        assert again.result()[k] == approx(v, scale=T, width=probs.numel()), k
    empty = HeadStats.merge([shards[3]]).result()
    assert all(math.isnan(x) for x in empty["entropy"])  # no batch anywhere: as one empty accumulator
