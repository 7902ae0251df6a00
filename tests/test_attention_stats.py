"""Streaming per-head attention statistics on maps whose answers can be worked out by hand."""

from __future__ import annotations

import json
import math

import pytest
import torch

import diagnose
from diagnose import attention_stats
from diagnose.attention_stats import HeadStats, entropy_and_max
from diagnose.stat_context import BatchContext
from diagnose.zoo import ModelConfig, Transformer
from .tolerance import approx, assert_close, size_of

pytestmark = pytest.mark.numerics

T = 6


def stats(probs, mask=None):
    acc = HeadStats(probs.shape[1])
    if isinstance(mask, BatchContext):
        acc.update(probs, batch=mask)
    else:
        acc.update(probs, mask)
    return acc.result()


def test_uniform_attention():
    probs = torch.full((2, 3, T, T), 1.0 / T)  # [B, H, Tq, Tk]
    s = stats(probs)
    dist = sum(abs(q - k) for q in range(T) for k in range(T)) / (T * T)
    want = dict(entropy=math.log(T), max_weight=1 / T, first_token=1 / T, self=1 / T, prev_token=1 / T,
                padding=0.0, mean_distance=dist)
    for k, v in want.items():
        assert s[k] == approx([v] * 3, scale=T, width=probs.numel()), k


def test_one_hot_previous_token():
    probs = torch.zeros(1, 2, T, T)
    for q in range(T):
        probs[0, :, q, max(q - 1, 0)] = 1.0  # row 0 can only look at itself
    s = stats(probs)
    assert s["entropy"] == approx([0.0, 0.0], scale=1.0, width=probs.numel())
    assert s["max_weight"] == approx([1.0, 1.0], scale=1.0, width=probs.numel())
    assert s["prev_token"] == approx([1.0, 1.0], scale=1.0, width=probs.numel())  # every row that has a previous position
    assert s["self"] == approx([1 / T] * 2, scale=1.0, width=probs.numel())
    assert s["first_token"] == approx([2 / T] * 2, scale=1.0, width=probs.numel())
    assert s["mean_distance"] == approx([(T - 1) / T] * 2, scale=T, width=probs.numel())


def test_next_last_and_local():
    """Head 0 looks at the next position (the last row at itself), head 1 at the last real key."""
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, 4:] = 0  # example 1: 4 real tokens, its last real key is position 3
    probs = torch.zeros(2, 2, T, T)
    for q in range(T):
        probs[:, 0, q, min(q + 1, T - 1)] = 1.0
    probs[0, 1, :, T - 1] = 1.0
    probs[1, 1, :, 3] = 1.0
    s = stats(probs, mask)
    # next_token over the real rows that have a next position: T - 1 in example 0, all 4 in example 1
    assert s["next_token"][0] == approx(1.0, scale=1.0, width=probs.numel())
    assert s["last_token"][1] == approx(1.0, scale=1.0, width=probs.numel())
    # head 0 lands on the last real key from rows T-2, T-1 of example 0 and row 2 of example 1
    assert s["last_token"][0] == approx(3 / (T + 4), scale=1.0, width=probs.numel())
    assert s["local"][0] == approx((T - 1 + 4) / (T + 4), scale=1.0, width=probs.numel())  # one step away, except example 0's last row
    assert s["local"][1] == approx((2 + 2) / (T + 4), scale=1.0, width=probs.numel())  # rows T-3, T-2 of ex. 0; rows 1, 2 of ex. 1


def test_causal_uniform_entropy():
    probs = torch.ones(T, T).tril()
    probs = (probs / probs.sum(-1, keepdim=True))[None, None]  # row q uniform over q + 1 keys
    s = stats(probs)
    assert s["entropy"] == approx([sum(math.log(q + 1) for q in range(T)) / T], scale=T, width=probs.numel())
    assert s["mean_distance"] == approx([sum(q / 2 for q in range(T)) / T], scale=T, width=probs.numel())


def test_padding_mass_and_padded_rows_excluded():
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, 4:] = 0  # example 1 has 4 real tokens
    probs = torch.full((2, 1, T, T), 1.0 / T)  # leaks onto padding (the mask_fill="zero" bug)
    probs[1, :, 4:] = 0.0
    probs[1, :, 4:, 0] = 1.0  # padded query rows: one-hot, must not count
    s = stats(probs, mask)
    n_rows = T + 4
    assert s["padding"] == approx([4 * (2 / T) / n_rows], scale=1.0, width=probs.numel())
    assert s["entropy"] == approx([math.log(T)], scale=T, width=probs.numel())
    assert s["max_weight"] == approx([1 / T], scale=1.0, width=probs.numel())
    e, m = entropy_and_max(probs, mask)
    assert e.tolist() == approx(s["entropy"], scale=T, width=probs.numel())
    assert m.tolist() == approx(s["max_weight"], scale=1.0, width=probs.numel())


def test_streaming_and_chunking_agree(monkeypatch):
    probs = torch.softmax(torch.randn(5, 2, T, T), -1)
    mask = torch.ones(5, T)
    mask[3, 2:] = 0
    ids = torch.randint(0, 3, (5, T), generator=torch.Generator().manual_seed(0))  # copies: token statistics too
    whole = stats(probs, BatchContext(mask, ids))
    acc = HeadStats(2)
    acc.update(probs[:2], batch=BatchContext(mask[:2], ids[:2]))
    acc.update(probs[2:], batch=BatchContext(mask[2:], ids[2:]))
    monkeypatch.setattr(attention_stats, "_CHUNK", 2 * T * T)  # one example per reduction step
    chunked = stats(probs, BatchContext(mask, ids))
    for k in whole:
        assert acc.result()[k] == approx(whole[k], scale=T, width=probs.numel())  # two summation orders
        assert chunked[k] == approx(whole[k], scale=T, width=probs.numel())


def test_entropy_and_max_stays_on_device():
    probs = torch.softmax(torch.randn(2, 3, 4, 4), -1)
    e, m = entropy_and_max(probs)
    assert isinstance(e, torch.Tensor) and e.shape == (3,) and m.shape == (3,)
    want = (-(probs * probs.log()).sum(-1)).mean((0, 2))
    assert_close(e, want, scale=4, width=probs.numel())
    assert_close(m, probs.amax(-1).mean((0, 2)), scale=1.0, width=probs.numel())


def test_attention_summary_matches_capture():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(kind="classifier", n_layers=2)).eval()
    ids = torch.randint(1, 32, (5, 8))
    mask = torch.ones(5, 8, dtype=torch.long)
    mask[2, 5:] = 0
    data = diagnose.DataSet(input_ids=ids, attention_mask=mask)
    summary = diagnose.attention_summary(model, data, keep=3, batch_size=2)
    cap = diagnose.capture(model, {"input_ids": ids, "attention_mask": mask})
    size = size_of(model)
    assert summary.n_examples == 5
    for i, maps in enumerate(cap.attention):
        for k, v in stats(maps, BatchContext(mask, ids)).items():
            assert summary.stats[i][k] == approx(v, scale=8, width=maps.numel()), k
        assert_close(summary.examples[i], maps[:3], **size)
    assert set(summary.head(1, 2)) == set(attention_stats.STATS)
    doc = json.loads(json.dumps(summary.to_json(maps=True)))
    assert doc["schema"] == "diagnose.attention/1" and len(doc["sites"][0]["maps"]) == 3
    pairs = [(data.inputs(s, s + 2), None) for s in range(0, 5, 2)]  # (inputs, labels) pairs
    for micro in (0, 1):  # whole batches, then one example per forward: same statistics
        again = diagnose.attention_summary(model, pairs, keep=0, micro_batch=micro)
        for k in attention_stats.STATS:
            assert again.stats[1][k] == approx(summary.stats[1][k], scale=8, depth=size["depth"], width=5 * 8 * 8)
        assert again.examples[0].numel() == 0 and again.n_examples == 5


def test_induction_and_duplicate_token_on_a_repeated_sequence():
    """On "5 6 7 8 5 6 7 8", head 0 looks at the token after the earlier copy (query 4, a 5, at key 1,
    the 6), head 1 at the earlier copy itself; rows 0-3 have no earlier copy and are not counted."""
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8]])
    n = ids.shape[1]
    probs = torch.zeros(1, 3, n, n)  # [B, H, Tq, Tk]
    for q in range(n):
        probs[0, 0, q, q - 3 if q >= 4 else 0] = 1.0
        probs[0, 1, q, max(q - 4, 0)] = 1.0
        probs[0, 2, q, max(q - 1, 0)] = 1.0  # previous token: neither
    acc = HeadStats(3)
    acc.update(probs, batch=BatchContext.of(ids))
    s = acc.result()
    assert s["induction"] == approx([1.0, 0.0, 0.0], scale=1.0, width=probs.numel())
    assert s["duplicate_token"] == approx([0.0, 1.0, 0.0], scale=1.0, width=probs.numel())
    without_ids = HeadStats(3)
    without_ids.update(probs)
    assert all(math.isnan(v) for v in without_ids.result()["induction"])  # NaN: not measurable, not 0


def test_induction_rows_are_those_with_an_earlier_copy():
    """Half the weight on the target, on the one row (of two examples) that has one: mean 0.5 there."""
    ids = torch.tensor([[1, 2, 1], [3, 4, 5]])
    probs = torch.full((2, 1, 3, 3), 0.0)
    probs[:, 0, :, 0] = 1.0
    probs[0, 0, 2] = torch.tensor([0.5, 0.5, 0.0])  # query 2 (a 1): key 1 (the 2) is the target
    acc = HeadStats(1)
    acc.update(probs, batch=BatchContext.of(ids))
    assert acc.result()["induction"] == approx([0.5], scale=1.0, width=probs.numel())
    assert acc.result()["duplicate_token"] == approx([0.5], scale=1.0, width=probs.numel())
