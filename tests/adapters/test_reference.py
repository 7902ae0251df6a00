"""The reference Transformer under every switch: maps equal an independent recomputation from
the weights, outputs are untouched, the gate equals weight zeroing, blocks are blocks.{i}."""

from __future__ import annotations

import math

import pytest
import torch

import diagnose
from diagnose.zoo import ModelConfig
from diagnose.zoo.model import Transformer, apply_rotary

from ..hooks import hook_snapshot
from ..tolerance import assert_close, assert_exact

pytestmark = pytest.mark.numerics

SWITCHES = {
    "lm": {},
    "classifier": dict(kind="classifier"),
    "post_ln_no_residual": dict(kind="classifier", norm="post", residual=False),
    "rotary_unscaled": dict(positions="rotary", attn_scale="none"),
    "zero_fill": dict(kind="classifier", mask_fill="zero", positions="sinusoidal"),
    "neg_inf_fill": dict(mask_fill="-inf", positions="none"),
}


def independent_probs(model: Transformer, layer: int, x: torch.Tensor, pad: torch.Tensor | None) -> torch.Tensor:
    """Attention probabilities recomputed from the weights.  # [B, H, T, T]"""
    cfg, attn = model.cfg, model.blocks[layer].attn
    B, T, C = x.shape
    H, D = cfg.n_heads, cfg.head_dim
    q, k, _ = (t.view(B, T, H, D).transpose(1, 2) for t in (x @ attn.qkv.weight.T + attn.qkv.bias).split(C, -1))
    if cfg.positions == "rotary":
        q, k = apply_rotary(q, model.rope_cos[:T], model.rope_sin[:T]), apply_rotary(k, model.rope_cos[:T], model.rope_sin[:T])
    s = q @ k.transpose(-1, -2) / (math.sqrt(D) if cfg.attn_scale == "sqrt" else 1.0)
    banned = torch.zeros(B, 1, T, T, dtype=torch.bool)
    if cfg.is_causal:
        banned |= torch.ones(T, T, dtype=torch.bool).triu(1)
    if pad is not None:
        banned |= (pad == 0)[:, None, None, :]
    fill = {"large": torch.finfo(s.dtype).min, "-inf": float("-inf"), "zero": 0.0}[cfg.mask_fill]
    return torch.softmax(s.masked_fill(banned, fill), -1)


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_reference_switches(switch, gate_check):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**SWITCHES[switch])).eval()
    ids = torch.randint(1, 32, (3, 8))  # [B, T]
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[1, 5:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    sites = diagnose.find_heads(model)
    assert [(s.layer, s.name, s.n_heads, s.head_dim) for s in sites] == [(i, f"blocks.{i}.attn", 4, 16) for i in range(2)]
    seen: list[torch.Tensor] = []  # what enters each attention module
    handles = [b.attn.register_forward_pre_hook(lambda _m, a: seen.append(a[0])) for b in model.blocks]
    with torch.no_grad():
        plain = model(**inputs)
    for h in handles:
        h.remove()
    before = hook_snapshot(model)
    cap = diagnose.capture(model, inputs)
    assert hook_snapshot(model) == before
    assert_exact(cap.output, plain)  # watching changes nothing
    for i, got in enumerate(cap.attention):
        want = independent_probs(model, i, seen[i], mask)
        assert got.shape == (3, 4, 8, 8)
        # from the layer's input, independently: one layer's sums (q, k over d_model, then scores)
        assert_close(got, want, scale=1.0, width=sites[i].n_heads * sites[i].head_dim)
    assert sites[0].adapter.blocks(model) == [("blocks.0", model.blocks[0]), ("blocks.1", model.blocks[1])]
    gate_check(model, inputs)


def test_gate_per_example():
    """fn sees [B, T, H, D] and may treat each example differently (batched ablations)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig()).eval()
    ids = torch.randint(0, 32, (2, 6))
    site = diagnose.find_heads(model)[1]

    def only_second(h: torch.Tensor) -> torch.Tensor:  # [B, T, H, D]
        assert h.shape == (2, 6, 4, 16)
        factor = torch.ones(2, 1, 4, 1)
        factor[1, :, 2] = 0
        return h * factor

    with torch.no_grad():
        base = model(ids)
        with site.adapter.intervene(site, only_second):
            out = model(ids)
    assert (out[0] - base[0]).abs().max() == 0 and (out[1] - base[1]).abs().max() > 1e-6
