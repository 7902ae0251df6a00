"""Hand-written nanoGPT-style attention (explicit softmax, and F.scaled_dot_product_attention
with is_causal=True) is found by the generic probe; user-named modules and registered
adapters; the error when nothing is found says how to name the layers."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import diagnose
from diagnose.adapters.generic import GenericAdapter
from diagnose.adapters.registry import unregister_adapter
from diagnose.adapters._hooks import hook_snapshot
from diagnose.errors import NoAttentionFoundError


class CausalSelfAttention(nn.Module):
    def __init__(self, C: int, H: int, fused: bool):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.n_head, self.fused = H, fused

    def scores(self, x):
        """Independent probabilities for the test.  # [B, H, T, T]"""
        q, k, _ = self._qkv(x)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])
        T = x.shape[1]
        att = att.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
        return F.softmax(att, dim=-1)

    def _qkv(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        return [t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v)]  # [B, H, T, D]

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self._qkv(x)
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = self.scores(x) @ v  # explicit softmax
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, C, H, fused):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(C), CausalSelfAttention(C, H, fused), nn.LayerNorm(C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, fused: bool, V=40, C=24, H=3, L=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(16, C)
        self.h = nn.ModuleList(Block(C, H, fused) for _ in range(L))
        self.lm_head = nn.Linear(C, V)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.h:
            x = b(x)
        return self.lm_head(x)


@pytest.mark.parametrize("fused", [False, True])
def test_nanogpt(fused, gate_check):
    model = NanoGPT(fused).eval()
    idx = torch.randint(0, 40, (2, 9))  # [B, T]
    sites = diagnose.find_heads(model)
    assert [(s.name, s.n_heads, s.head_dim, s.adapter.family) for s in sites] == [
        (f"h.{i}.attn", 3, 8, "generic") for i in range(2)]
    assert all(s.out_proj is s.module.c_proj for s in sites)
    before = hook_snapshot(model)
    with torch.no_grad():
        plain = model(idx)
        xs = []
        hs = [b.attn.register_forward_pre_hook(lambda _m, a: xs.append(a[0])) for b in model.h]
        model(idx)
        for h in hs:
            h.remove()
    cap = diagnose.capture(model, idx)
    assert hook_snapshot(model) == before
    assert (cap.output - plain).abs().max() <= 1e-6
    for b, x, got in zip(model.h, xs, cap.attention):
        with torch.no_grad():
            want = b.attn.scores(x)
        assert got.shape == (2, 3, 9, 9) and (got - want).abs().max() <= 1e-5
    assert list(cap.activations) == ["h.0", "h.1"]
    gate_check(model, idx)


class OpaqueLayer(nn.Module):
    """Attention computed with einsum + exp: nothing for the probe to see."""

    def __init__(self, C=16, H=4):
        super().__init__()
        self.mix, self.out, self.H = nn.Linear(C, 3 * C), nn.Linear(C, C), H

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.mix(x).view(B, T, 3, self.H, C // self.H).unbind(2)  # [B, T, H, D]
        s = torch.einsum("bqhd,bkhd->bhqk", q, k).exp()
        p = s / s.sum(-1, keepdim=True)  # [B, H, Tq, Tk]
        return x + self.out(torch.einsum("bhqk,bkhd->bqhd", p, v).reshape(B, T, C))


class Opaque(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(OpaqueLayer() for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_nothing_found_says_how_to_name_it():
    with pytest.raises(NoAttentionFoundError) as err:
        diagnose.find_heads(Opaque())
    msg = str(err.value)
    assert "--attention-module" in msg and "--heads" in msg and "register_adapter" in msg


def test_named_modules_and_gate(gate_check):
    model = Opaque().eval()
    x = torch.randn(2, 5, 16)
    sites = diagnose.find_heads(model, attention_module="layers.*", n_heads=4)
    assert [(s.name, s.n_heads, s.head_dim) for s in sites] == [("layers.0", 4, 4), ("layers.1", 4, 4)]
    assert sites[0].out_proj is model.layers[0].out
    assert [n for n, _ in sites[0].adapter.blocks(model)] == ["layers.0", "layers.1"]
    with torch.no_grad():
        base = model(x)
        with sites[1].adapter.intervene(sites[1], lambda h: h * 0):
            gated = model(x)
        saved = model.layers[1].out.weight.clone()
        model.layers[1].out.weight.zero_()
        want = model(x)
        model.layers[1].out.weight.copy_(saved)
    assert (gated - want).abs().max() <= 1e-6 and (gated - base).abs().max() > 1e-4
    before = hook_snapshot(model)
    with pytest.raises(NoAttentionFoundError, match="ran but computed no softmax"):
        diagnose.capture(model, x, sites=sites)  # gate works, but nothing shows the probabilities
    assert hook_snapshot(model) == before
    assert diagnose.capture(model, x, sites=sites, attention=False).activations
    with pytest.raises(NoAttentionFoundError, match="no module name matches"):
        diagnose.find_heads(model, attention_module="encoder.*", n_heads=4)


def test_registered_adapter_goes_first():
    model = NanoGPT(False)

    class Mine(GenericAdapter):
        family = "mine"

    mine = diagnose.register_adapter(Mine())
    try:
        assert {s.adapter.family for s in diagnose.find_heads(model)} == {"mine"}
    finally:
        unregister_adapter(mine)
    assert {s.adapter.family for s in diagnose.find_heads(model)} == {"generic"}
    with pytest.raises(diagnose.DiagnoseError, match="lacks"):
        diagnose.register_adapter(object())


def test_watch_unwinds_when_forward_raises():
    model = NanoGPT(True).eval()
    site = diagnose.find_heads(model)[0]
    before = hook_snapshot(model)
    with pytest.raises(IndexError):
        with site.adapter.watch_pattern(site, lambda p: None):
            model(torch.randint(0, 40, (1, 30)))  # longer than the position table
    assert hook_snapshot(model) == before
    with pytest.raises(RuntimeError):
        with site.adapter.watch_pattern(site, lambda p: None):
            model.h[0].attn(torch.randn(1, 4, 5))  # wrong width: raises inside the attention module
    assert hook_snapshot(model) == before
