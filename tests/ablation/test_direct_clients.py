"""Direct effects on the client models (tests/clients/: nanoGPT, minGPT, timm and torchvision ViTs,
x-transformers) equal the hand computation of test_direct_traced.py: the head's slice of the output
projection zeroed, every later sublayer returning its clean output (named here from each client's own
layout), every norm of the layers and the final norm with its clean scale, the output layers as they are.

The library API with inputs each model takes: nanoGPT with targets (so that it returns every position's
logits), x-transformers' attention layers named (the finder does not yet gate a projection its parent
applies), the ViTs with pixel batches."""

from __future__ import annotations

import pytest
from dataclasses import replace

import torch

from diagnose.adapters._generic import named_sites
from diagnose.objectives import IGNORE
from diagnose.sites import find_heads

from ..clients import mingpt, nanogpt, timm_vit, torchvision_vit, xtransformers
from .test_direct_traced import check_against_hand

pytestmark = pytest.mark.numerics

N = 8


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (N, 8), generator=torch.Generator().manual_seed(1))  # [N, T]


def _next(ids: torch.Tensor) -> torch.Tensor:
    """Next-token targets, IGNORE at the last position.  # [N, T]"""
    t = torch.full_like(ids, IGNORE)
    t[:, :-1] = ids[:, 1:]
    return t


def _images() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(N, 3, 16, 16, generator=g), torch.arange(N) % 10  # [N, 3, 16, 16], [N]


def _louder(model):
    """Weights large enough that heads visibly matter on their direct path (the clients init at 0.02)."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)
    return model


def _gpt_parts(blocks, final, mlp_out):
    """(weight, later, norms) for a GPT stack: attn of later layers, the MLP output of this one and later."""
    def parts(model, l):
        later = [b.attn for j, b in enumerate(blocks(model)) if j > l]
        later += [mlp_out(b) for j, b in enumerate(blocks(model)) if j >= l]
        norms = [n for b in blocks(model) for n in (b.ln_1, b.ln_2)] + [final(model)]
        return blocks(model)[l].attn.c_proj.weight, later, norms
    return parts


def test_nanogpt():
    ids = _ids()
    parts = _gpt_parts(lambda m: m.transformer.h, lambda m: m.transformer.ln_f, lambda b: b.mlp)
    check_against_hand(_louder(nanogpt.make()), ({"idx": ids, "targets": ids}, _next(ids)), "lm", parts)


def test_mingpt():
    ids = _ids()
    parts = _gpt_parts(lambda m: m.transformer.h, lambda m: m.transformer.ln_f, lambda b: b.mlp.c_proj)
    check_against_hand(_louder(mingpt.make()), (ids, _next(ids)), "lm", parts)  # its MLP is a lambda: c_proj


def test_timm_vit():
    def parts(model, l):
        blocks = model.blocks
        later = [b.attn for j, b in enumerate(blocks) if j > l] + [b.mlp for j, b in enumerate(blocks) if j >= l]
        norms = [n for b in blocks for n in (b.norm1, b.norm2)] + [model.norm]
        return blocks[l].attn.proj.weight, later, norms
    model, batch = _louder(timm_vit.make()), _images()
    check_against_hand(model, batch, "classification", parts, sites=find_heads(model, example=batch[0]))


def test_timm_vit_with_layer_scale():
    """LayerScale between the attention and the residual add: part of the head's write, not clamped."""
    def parts(model, l):
        blocks = model.blocks
        later = [b.attn for j, b in enumerate(blocks) if j > l] + [b.mlp for j, b in enumerate(blocks) if j >= l]
        return blocks[l].attn.proj.weight, later, [n for b in blocks for n in (b.norm1, b.norm2)] + [model.norm]
    model, batch = _louder(timm_vit.make(init_values=0.5)), _images()
    check_against_hand(model, batch, "classification", parts, sites=find_heads(model, example=batch[0]))


def test_torchvision_vit():
    def parts(model, l):
        layers = list(model.encoder.layers)
        later = [b.self_attention for j, b in enumerate(layers) if j > l]
        later += [b.mlp for j, b in enumerate(layers) if j >= l]
        norms = [n for b in layers for n in (b.ln_1, b.ln_2)] + [model.encoder.ln]
        return layers[l].self_attention.out_proj.weight, later, norms
    check_against_hand(_louder(torchvision_vit.make()), _images(), "classification", parts)


def test_xtransformers():
    model, ids = _louder(xtransformers.make()), _ids()
    layers = model.attn_layers.layers  # (norms, block, residual) per layer: attention at 0, 2; feed-forward at 1, 3
    sites = [replace(s, layer=i) for i, s in enumerate(
        [*named_sites(model, "attn_layers.layers.0.1", 2, ids), *named_sites(model, "attn_layers.layers.2.1", 2, ids)])]

    def parts(m, l):
        later = [layers[i][1] for i in range(2 * l + 1, len(layers))]  # every block after this attention
        norms = [layer[0][0].ln for layer in layers] + [m.attn_layers.final_norm.ln]
        return layers[2 * l][1].to_out.weight, later, norms
    check_against_hand(model, (ids, _next(ids)), "lm", parts, sites=sites)
