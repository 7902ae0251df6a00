"""Cutting heads out of the reference Transformer (diagnose.zoo): fused qkv rows, proj columns.

A layer left with no heads keeps empty projections: its attention output is exactly the output
projection's bias, as the gated model's is (the bias path stays exact)."""

from __future__ import annotations

import torch

from ._slice import head_index, keep_inputs, keep_outputs


ATTRIBUTES = ("n_heads",)  # what this cut changes (cut.ATTRIBUTES)

def cut(attn, out_proj, keep: list[int], n_heads: int, head_dim: int, fill: torch.Tensor | None) -> dict:
    width = n_heads * head_dim
    rows = torch.cat([head_index(keep, head_dim, part * width) for part in range(3)])  # q, k, v blocks
    keep_outputs(attn.qkv, rows)
    keep_inputs(attn.proj, head_index(keep, head_dim), fold=fill)
    attn.n_heads = len(keep)
    return {}
