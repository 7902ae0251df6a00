"""Hand-written nanoGPT-style attention (tests/nano.py: explicit softmax, and
F.scaled_dot_product_attention with is_causal=True) is found by the generic probe; user-named
modules and registered adapters; the error when nothing is found says how to name the layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import diagnose
from diagnose.adapters import unregister_adapter
from diagnose.adapters._generic import GenericAdapter
from diagnose.errors import NoAttentionFoundError

from ..hooks import hook_snapshot
from ..tolerance import assert_close, assert_differ, assert_exact, model_size, size_of
from ..nano import nanogpt

pytestmark = pytest.mark.numerics


@pytest.mark.parametrize("fused", [False, True])
def test_nanogpt(fused, gate_check):
    model = nanogpt(fused).eval()
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
    assert_exact(cap.output, plain)  # watching changes nothing
    for b, x, got in zip(model.h, xs, cap.attention):
        with torch.no_grad():
            want = b.attn.scores(x)
        assert got.shape == (2, 3, 9, 9)
        if fused:  # the model ran sdpa, capture recomputed the map: other sums, within one layer
            assert_close(got, want, scale=1.0, width=size_of(model)["width"])
        else:
            assert_exact(got, want)  # the same module on the same input: the softmax it computed
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


def test_naming_a_module_without_softmax_is_refused_not_swept():
    model = Opaque().eval()
    x = torch.randn(2, 5, 16)
    with pytest.raises(NoAttentionFoundError, match=r"compute no softmax .*layers\.0 \(OpaqueLayer\)"):
        diagnose.find_heads(model, attention_module="layers.*", n_heads=4, example=x)
    with pytest.raises(NoAttentionFoundError, match="no module name or class matches"):
        diagnose.find_heads(model, attention_module="encoder.*", n_heads=4, example=x)


class OpaqueAdapter(diagnose.InterceptAdapter):
    """What docs/families.md shows: a user's adapter on the public base class, declaring the sites."""

    family = "opaque"

    def find(self, model):
        if not isinstance(model, Opaque):
            return None
        return [diagnose.AttentionSite(i, f"layers.{i}", 4, 4, layer, self, out_proj=layer.out)
                for i, layer in enumerate(model.layers)]


def test_an_adapter_on_the_public_base_gates_what_the_finder_cannot_see(gate_check):
    model = Opaque().eval()
    x = torch.randn(2, 5, 16)
    adapter = diagnose.register_adapter(OpaqueAdapter())
    try:
        sites = diagnose.find_heads(model)
    finally:
        unregister_adapter(adapter)
    assert [(s.name, s.n_heads, s.head_dim, s.adapter.family) for s in sites] == [
        ("layers.0", 4, 4, "opaque"), ("layers.1", 4, 4, "opaque")]
    assert [n for n, _ in sites[0].adapter.blocks(model)] == ["layers.0", "layers.1"]
    with torch.no_grad():
        base = model(x)
        with sites[1].adapter.intervene(sites[1], lambda h: h * 0):
            gated = model(x)
        saved = model.layers[1].out.weight.clone()
        model.layers[1].out.weight.zero_()
        want = model(x)
        model.layers[1].out.weight.copy_(saved)
    depth, width = model_size(sites)
    size = {"depth": depth, "width": width}
    assert_close(gated, want, **size)  # gated heads vs zeroed weights: other sums
    assert_differ(gated, base, **size)
    before = hook_snapshot(model)
    with pytest.raises(NoAttentionFoundError, match="ran but computed no softmax"):
        diagnose.capture(model, x, sites=sites)  # gate works, but nothing shows the probabilities
    assert hook_snapshot(model) == before
    assert diagnose.capture(model, x, sites=sites, attention=False).activations


def test_registered_adapter_goes_first():
    model = nanogpt(False)

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
    model = nanogpt(True).eval()
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
