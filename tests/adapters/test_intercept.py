"""The SDPA recomputation: probs @ v must give back SDPA's own output for every mask form."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from diagnose.adapters._intercept import AttentionMode, sdpa_probs
from diagnose.adapters._probs import LazyProbs, materialise, query_chunks
from ..tolerance import assert_close, magnitude
from ..versions import torch_before

pytestmark = pytest.mark.numerics


def _case(name):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=g), torch.randn(2, 4, 7, 8, generator=g),
               torch.randn(2, 4, 7, 8, generator=g))  # [B, H, T, D]
    kw = {}
    if name == "bool_mask":
        kw["attn_mask"] = torch.rand(2, 1, 5, 7, generator=g) > 0.3
        kw["attn_mask"][..., 0] = True  # every row keeps a key
    elif name == "float_mask":
        kw["attn_mask"] = torch.randn(5, 7, generator=g)
    elif name == "causal":
        kw["is_causal"] = True  # Tq != Tk: top-left aligned, like torch
    elif name == "scale":
        kw["scale"] = 0.3
    elif name == "gqa":
        k, v = k[:, :2], v[:, :2]
        kw["enable_gqa"] = True
    return q, k, v, kw


_GQA = pytest.param("gqa", marks=pytest.mark.skipif(torch_before(2, 5),
                                                     reason="SDPA's enable_gqa arrived in torch 2.5"))


@pytest.mark.parametrize("name", ["plain", "bool_mask", "float_mask", "causal", "scale", _GQA])
def test_probs_reproduce_sdpa(name):
    q, k, v, kw = _case(name)
    want = F.scaled_dot_product_attention(q, k, v, **kw)  # [B, H, Tq, D]
    probs = sdpa_probs(q, k, kw.get("attn_mask"), kw.get("is_causal", False), kw.get("scale"))
    vv = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    assert_close(probs @ vv, want, scale=magnitude(vv), width=probs.shape[-1] * q.shape[-1])
    assert_close(probs.sum(-1), torch.ones(probs.shape[:3]), width=probs.shape[-1])


@pytest.mark.parametrize("name", ["plain", "bool_mask", "float_mask", "causal", "scale", _GQA])
def test_lazy_rows_in_chunks_are_the_whole_map(name):
    q, k, v, kw = _case(name)
    lazy = LazyProbs(q, k, kw.get("attn_mask"), kw.get("is_causal", False), kw.get("scale"))
    whole = sdpa_probs(q, k, kw.get("attn_mask"), kw.get("is_causal", False), kw.get("scale"))
    assert lazy.shape == whole.shape
    chunks = list(query_chunks(lazy, lazy.shape[0] * lazy.shape[1] * lazy.shape[-1] * 2))  # two rows a step
    assert [s for s, _ in chunks] == list(range(0, lazy.shape[-2], 2))
    Tk = lazy.shape[-1]
    causal = name == "causal"  # keys no row of a chunk can see are left out; otherwise every key is read
    assert [c.shape[-1] for _, c in chunks] == [min(s + 2, lazy.shape[-2], Tk) if causal else Tk for s, _ in chunks]
    padded = [F.pad(c, (0, Tk - c.shape[-1])) for _, c in chunks]  # the keys left out weigh 0
    assert_close(torch.cat(padded, -2), whole, width=whole.shape[-1])


def test_mode_sees_positional_and_keyword_sdpa_and_leaves_output_alone():
    q, k, v, kw = _case("causal")
    seen = []
    with AttentionMode(lambda kind, p, _q: seen.append((kind, p))):
        out = F.scaled_dot_product_attention(q, k, v, None, 0.0, True)
        torch.softmax(torch.randn(2, 4, 5, 5), dim=1)  # not the last dim: not attention
        torch.softmax(torch.randn(4, 5), dim=-1)  # not 4-D: not attention
    assert [s[0] for s in seen] == ["sdpa"]
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert_close(materialise(seen[0][1]) @ v, out, scale=magnitude(v), width=v.shape[-2] * v.shape[-1])
