"""diagnose finds the heads and residual blocks of the client models (tests/clients/*) from a real
example, with no adapter of theirs: capture equals each model's own softmax, and closing a head
through the gate equals zeroing that head's slice of the output projection's weight (for
x-transformers, `to_out`, which the parent `Attention` applies after its `Attend` child returns)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import diagnose

from ..hooks import hook_snapshot
from diagnose._activations import STAT_NAMES, hidden_stats

from ..tolerance import approx, assert_close, assert_differ
from . import mingpt, nanogpt, timm_vit, torchvision_vit, xtransformers
from .files import pixel_values

SIZE = dict(depth=2, width=32)  # every client model here: 2 layers, width 32


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))  # [B, T]


def _inputs_of(module: nn.Module, model: nn.Module, x) -> list[torch.Tensor]:
    """The first input (positional, or torchvision's query=) of each call of `module` in one forward of model(x)."""
    seen: list[torch.Tensor] = []
    h = module.register_forward_pre_hook(lambda _m, args, kwargs: seen.append(args[0] if args else kwargs["query"]),
                                         with_kwargs=True)
    try:
        with torch.no_grad():
            model(x)
    finally:
        h.remove()
    return seen


def _gpt_softmax(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """nanoGPT's / minGPT's attention map by hand from c_attn.  # [B, H, T, T]"""
    B, T, C = x.shape
    H = attn.n_head
    q, k, _ = attn.c_attn(x).split(C, dim=2)
    q, k = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
    return scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)


def _timm_softmax(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """timm's attention map by hand from qkv (no mask: a ViT sees every patch).  # [B, H, N, N]"""
    B, N, _ = x.shape
    q, k, _ = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    return ((attn.q_norm(q) @ attn.k_norm(k).transpose(-2, -1)) * attn.scale).softmax(-1)


def _mha_softmax(attn: nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """torchvision's attention map: the module itself asked for its per-head weights.  # [B, H, N, N]"""
    return attn(x, x, x, need_weights=True, average_attn_weights=False)[1]


def _gpt(make, **kw):
    model = make(**kw)
    return model, _ids(), [b.attn for b in model.transformer.h], _gpt_softmax


CLIENTS = {
    "nanogpt": lambda: _gpt(nanogpt.make, flash=False),
    "nanogpt-flash": lambda: _gpt(nanogpt.make),
    "mingpt": lambda: _gpt(mingpt.make),
    "timm": lambda: _vit_timm(fused_attn=False),
    "timm-fused": lambda: _vit_timm(fused_attn=True),
    "torchvision": lambda: _vit_tv(),
}


def _vit_timm(**kw):
    model = timm_vit.make(**kw)
    return model, pixel_values(2), [b.attn for b in model.blocks], _timm_softmax


def _vit_tv():
    model = torchvision_vit.make()
    return model, pixel_values(2), [b.self_attention for b in model.encoder.layers], _mha_softmax


BLOCKS = {
    "nanogpt": [f"transformer.h.{i}" for i in range(2)], "mingpt": [f"transformer.h.{i}" for i in range(2)],
    "timm": [f"blocks.{i}" for i in range(2)], "torchvision": [f"encoder.layers.encoder_layer_{i}" for i in range(2)],
}


@pytest.mark.parametrize("client", list(CLIENTS))
def test_capture_equals_the_models_own_softmax_and_blocks_are_the_residual_units(client):
    model, x, attns, own = CLIENTS[client]()
    sites = diagnose.find_heads(model, example=x)
    assert [s.module for s in sites] == attns
    blocks = sites[0].adapter.blocks(model)
    assert [n for n, _ in blocks] == BLOCKS[client.split("-")[0]]
    modules = dict(model.named_modules())
    assert all(m is modules[n] for n, m in blocks)  # the block itself, not its attention module
    before = hook_snapshot(model)
    cap = diagnose.capture(model, x)
    assert hook_snapshot(model) == before
    for attn, got in zip(attns, cap.attention, strict=True):
        (inp,) = _inputs_of(attn, model, x)
        with torch.no_grad():
            want = own(attn, inp)
        assert_close(got, want, scale=1.0, **SIZE)


def _surgery_equals_gate(model, x, site, head: int) -> None:
    """The gate closing `head` of `site` equals zeroing its columns of the projection's weight."""
    D = site.head_dim

    def close(h):  # [B, T, H, D]
        h = h.clone()
        h[:, :, head] = 0
        return h

    with torch.no_grad():
        base = model(x)
        with site.adapter.intervene(site, close):
            gated = model(x)
        w = site.out_proj.weight
        saved = w.detach().clone()
        w.data[:, head * D:(head + 1) * D] = 0
        try:
            want = model(x)
        finally:
            w.data.copy_(saved)
    base, gated, want = (t[0] if isinstance(t, tuple) else t for t in (base, gated, want))
    assert_close(gated, want, **SIZE)
    assert_differ(gated, base, **SIZE)


@pytest.mark.parametrize("client", list(CLIENTS))
def test_closing_a_head_equals_zeroing_its_slice_of_the_projection(client):
    model, x, _attns, _own = CLIENTS[client]()
    sites = diagnose.find_heads(model, example=x)
    for site in sites:
        _surgery_equals_gate(model, x, site, head=1)


@pytest.mark.parametrize("flash", [False, True])
def test_xtransformers_heads_gated_at_the_projection_the_parent_applies(flash):
    model, x = xtransformers.make(flash=flash), _ids()
    sites = diagnose.find_heads(model, example=x)
    attention = [model.attn_layers.layers[i][1] for i in (0, 2)]
    assert [s.name for s in sites] == ["attn_layers.layers.0.1.attend", "attn_layers.layers.2.1.attend"]
    assert [(s.n_heads, s.head_dim) for s in sites] == [(2, 16)] * 2
    assert [s.out_proj for s in sites] == [a.to_out for a in attention]  # applied by the parent, after Attend
    for site in sites:
        _surgery_equals_gate(model, x, site, head=1)
    # blocks: every (norms, block, residual) layer, attention and feed-forward, read at its residual add
    blocks = sites[0].adapter.blocks(model)
    assert [n for n, _ in blocks] == [f"attn_layers.layers.{i}" for i in range(4)]
    assert [m for _, m in blocks] == [model.attn_layers.layers[i][2] for i in range(4)]
    eager = xtransformers.make(flash=False)  # the same weights, the hand-written softmax it returns
    with torch.no_grad():
        _, maps = eager(x, return_attn=True)
    cap = diagnose.capture(model, x)
    for got, want in zip(cap.attention, maps, strict=True):
        assert_close(got, want, scale=1.0, **SIZE)
    with torch.no_grad():  # the stream entering layers 1..3: the output of layers 0..2
        _, inter = eager.attn_layers(eager.token_emb(x) + eager.pos_emb(x), return_hiddens=True)
    for name, want in zip(list(cap.activations)[:3], inter.hiddens[1:], strict=True):
        want_stats = dict(zip(STAT_NAMES, hidden_stats(want).tolist()))
        assert cap.activations[name] == approx(want_stats, **SIZE)


def test_attention_module_by_class_tells_attention_from_feed_forward():
    model, x = xtransformers.make(), _ids()
    with pytest.raises(diagnose.NoAttentionFoundError, match=r"compute no softmax .*FeedForward"):
        diagnose.find_heads(model, attention_module="attn_layers.layers.*.1", example=x)  # every layer's block
    for pattern in ("Attention", r"re:attn_layers\.layers\.\d*[02468]\.1"):
        sites = diagnose.find_heads(model, attention_module=pattern, example=x)
        assert [s.module for s in sites] == [model.attn_layers.layers[i][1] for i in (0, 2)]
        assert [s.out_proj for s in sites] == [model.attn_layers.layers[i][1].to_out for i in (0, 2)]
        _surgery_equals_gate(model, x, sites[1], head=0)


def test_a_model_without_an_embedding_and_no_example_says_what_to_pass():
    with pytest.raises(diagnose.NoAttentionFoundError, match="pass a real example"):
        diagnose.find_heads(timm_vit.make())


def test_a_traced_forward_that_fails_says_why():
    model = timm_vit.make()
    with pytest.raises(diagnose.NoAttentionFoundError, match=r"raised AssertionError: Input size \(8, 8\)"):
        diagnose.find_heads(model, example=pixel_values(2, size=8))
