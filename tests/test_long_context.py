"""Long contexts: statistics by chunks of query rows give what the whole maps give, and a
16k-token example is summarised without any [T, T] map (no operation returns a tensor that large;
peak resident memory is bench/bench_long_context.py's figure)."""

from __future__ import annotations

import math
from contextlib import ExitStack

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import diagnose
from diagnose import attention_stats, statistics
from diagnose.adapters._probs import LazyProbs
from diagnose.attention_stats import STATS, HeadStats

from .long_model import LongLM, twin
from .tolerance import approx, assert_close, magnitude, size_of

pytestmark = pytest.mark.numerics


def copies(p: torch.Tensor, ids: torch.Tensor | None, shift: int) -> torch.Tensor:
    """Mean mass on keys k with ids[k - shift] == ids[q], k - shift < q, over rows that have one.  # [H]"""
    H, T, _ = p.shape
    if ids is None:
        return torch.full((H,), float("nan"), dtype=torch.float64)
    q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
    src = (k - shift).clamp_min(0)
    m = (ids[src] == ids[q]) & (k - shift >= 0) & (k - shift < q) & (k <= q)  # [T, T]
    rows = m.any(-1)
    return (p * m).sum(-1)[:, rows].sum(-1) / rows.sum().clamp_min(1)


def reference(probs: torch.Tensor, ids: torch.Tensor | None = None) -> dict[str, list[float]]:
    """Every statistic straight from one example's whole causal map, float64.  # probs [1, H, T, T], ids [T]"""
    p = probs[0].double()  # [H, T, T]
    H, T, _ = p.shape
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    dist = (i - j).abs().double()  # [T, T]
    ent = -(p * p.clamp_min(1e-300).log()).sum(-1)  # [H, T]
    diag = lambda k: p.diagonal(k, -2, -1)  # noqa: E731  [H, T - |k|]
    out = {
        "entropy": ent.mean(-1), "max_weight": p.amax(-1).mean(-1), "first_token": p[..., 0].mean(-1),
        "self": diag(0).mean(-1), "prev_token": diag(-1).mean(-1), "next_token": diag(1).mean(-1),
        "padding": torch.zeros(H, dtype=torch.float64), "mean_distance": (p * dist).sum(-1).mean(-1),
        "last_token": p[..., T - 1].mean(-1),
        "local": (p * ((dist > 0) & (dist <= statistics.LOCAL))).sum(-1).mean(-1),
        "duplicate_token": copies(p, ids, 0), "induction": copies(p, ids, 1),  # NaN without ids
    }
    assert set(out) == set(STATS), "the reference covers every statistic"
    return {k: v.tolist() for k, v in out.items()}


@pytest.mark.slow
def test_chunked_statistics_match_the_whole_maps_at_2048():
    torch.manual_seed(0)
    model = LongLM().eval()
    ids = torch.randint(0, 64, (1, 2048))
    maps = diagnose.capture(twin(model), ids, activations=False).attention  # the model's own softmax
    got = diagnose.attention_summary(model, [ids], keep=0)  # SDPA: recomputed, by chunks of rows
    assert got.window is None and got.n_examples == 1
    for layer, m in enumerate(maps):
        want = reference(m, ids[0])
        for k in STATS:
            assert got.stats[layer][k] == approx(want[k], scale=max(1.0, magnitude(want[k])), depth=layer + 1,
                                                 width=m[0].numel()), (layer, k)
    eager = diagnose.attention_summary(twin(model), [ids], keep=0)  # the model's own maps, read by chunks
    for a, b in zip(eager.stats, got.stats):
        for k in STATS:
            assert a[k] == approx(b[k], scale=max(1.0, magnitude(b[k])), width=maps[0][0].numel()), k


def test_many_small_chunks_equal_one_chunk(monkeypatch):
    """Padding, a key cache (Tq < Tk) and rows split across chunks: same sums as one chunk."""
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(3, 2, 7, 10, generator=g) * 3, -1)  # [B, H, Tq, Tk]
    mask = torch.ones(3, 10)
    mask[1, 8:] = 0
    mask[2, 5:] = 0
    whole = HeadStats(2)
    whole.update(probs, mask)
    monkeypatch.setattr(attention_stats, "_CHUNK", 3 * 2 * 10 * 2)  # two query rows a step
    chunked = HeadStats(2)
    chunked.update(probs, mask)
    a, b = whole.result(), chunked.result()
    for k in STATS:
        assert a[k] == approx(b[k], scale=max(1.0, magnitude(b[k])), width=probs.numel()), k


def test_mha_rows_by_chunks_match_its_own_weights(monkeypatch):
    """nn.TransformerEncoder with key padding: statistics read a few rows at a time equal those
    of MultiheadAttention's own per-head weights (need_weights, average_attn_weights=False)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(3, 40, 16)
    pad = torch.zeros(3, 40, dtype=torch.bool)
    pad[1, 30:] = True
    inputs = {"src": x, "src_key_padding_mask": pad}
    mask = (~pad).long()  # [B, T] 1 real
    own = []
    h = x
    with torch.no_grad():
        for mod in model.layers:
            _, w = mod.self_attn(h, h, h, key_padding_mask=pad, average_attn_weights=False)  # [B, H, T, T]
            own.append(w)
            h = mod(h, src_key_padding_mask=pad)
    monkeypatch.setattr(attention_stats, "_CHUNK", 3 * 4 * 40 * 3)  # three query rows a step
    got = []
    sites = diagnose.find_heads(model, example=inputs)
    acc = [HeadStats(4) for _ in sites]
    with torch.no_grad(), ExitStack() as stack:
        for a, s in zip(acc, sites):
            stack.enter_context(s.adapter.watch_pattern(s, lambda p, a=a: (got.append(p), a.update(p, mask))))
        model(**inputs)
    assert all(isinstance(p, LazyProbs) for p in got), "MHA probabilities are recomputed by rows, not whole"
    for a, w in zip(acc, own):
        want = HeadStats(4)
        want.update(w, mask)
        for k in STATS:
            assert a.result()[k] == approx(want.result()[k], scale=max(1.0, magnitude(want.result()[k])), depth=2,
                                           width=w.numel()), k


def test_kept_maps_are_windowed():
    model = LongLM().eval()
    ids = torch.randint(0, 64, (2, 40))
    s = diagnose.attention_summary(model, [ids], keep=1, window=16)
    full = diagnose.capture(twin(model), ids[:1], activations=False).attention
    assert s.window == 16
    assert [tuple(e.shape) for e in s.examples] == [(1, 4, 16, 16)] * 2
    for kept, m in zip(s.examples, full):
        assert_close(kept, m[:, :, :16, :16], **size_of(model), scale=1.0)
    assert s.to_json(maps=True)["maps_window"] == 16
    assert diagnose.attention_summary(model, [ids], keep=1).window is None  # 40 < 512: whole maps


class _LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an operation returns while it is active."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(x, torch.Tensor):
                self.numel = max(self.numel, x.numel())
        return out


@pytest.mark.slow
def test_8k_tokens_without_any_whole_map():
    """One head's whole map at T = 8,192 would be T * T floats (256 MiB): no operation of the summary
    makes a tensor that large, whatever the machine. (At 16,384 tokens, four times the work, its peak
    resident memory, 0.68 GiB, is bench/bench_long_context.py's figure.)"""
    T = 8192
    model = LongLM().eval()
    ids = torch.randint(0, 64, (1, T))
    with _LargestTensor() as seen:
        s = diagnose.attention_summary(model, [ids], keep=1)
    assert seen.numel < T * T, f"a tensor of {seen.numel:,} elements: a whole [T, T] map was made"
    assert s.window == attention_stats.WINDOW and list(s.examples[0].shape) == [1, 4, 512, 512]
    assert all(0.0 < e < math.log(T) for e in s.stats[0]["entropy"])


def test_report_examples_from_windowed_maps_label_the_window():
    from diagnose.ablation.attention import _examples

    ids = torch.arange(1, 11)[None]  # [1, 10]
    mask = torch.ones(1, 10, dtype=torch.long)
    mask[0, 2] = 0  # a padded position inside the window
    maps = [torch.softmax(torch.randn(1, 2, 4, 4), -1)]  # windowed to the first 4 positions
    out = _examples(maps, [({"input_ids": ids, "attention_mask": mask}, None)], 1, None)
    assert out[0]["tokens"] == ["1", "2", "4"]  # real tokens of the window only
    assert torch.tensor(out[0]["attention"][0]).shape == (2, 3, 3)
