"""Slicing heads out of projections: the one cutter every family's declared layout drives.

A head h of width D owns D output features of each query, key and value projection (where they
sit is the family's ProjectionLayout: separate, blocked or interleaved) and the same D input
features of the output projection. nn.Linear stores weight [out, in]; Hugging Face's Conv1D
(GPT-2) stores weight [in, out], the transpose.

Grouped-query attention: query head q reads key/value head q // n_rep. A key/value head goes only
when its whole group of query heads goes. The groups left must be the same size (transformers
repeats every key/value head n_rep times); when they are not, each surviving key/value head is
repeated (its k/v rows copied) so that every group has r = gcd(group sizes) queries: exact, at the
cost of some key/value rows.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn as nn

from ..adapters.layout import BLOCKED, INTERLEAVED, ProjectionLayout

FEATURES = ("in_features", "out_features", "nf", "nx")  # what a cut Linear or Conv1D changes


def cut_heads(attn: nn.Module, out_proj: nn.Module, layout: ProjectionLayout, keep: list[int], n_heads: int,
              n_kv_heads: int, head_dim: int, fill: torch.Tensor | None) -> dict:
    """Keep only the query heads `keep` of one attention module (in place), as `layout` declares it.

    fill [H * D]: the removed heads' mean outputs (mean ablation), folded into the output bias.
    Returns what the result notes (grouped-query attention: key/value heads kept and copied), else {}.
    """
    keep = sorted(keep)
    kv, r = _kv_heads(keep, n_heads, n_kv_heads)
    for proj in layout.inputs:
        heads = kv if proj.kv else keep
        keep_outputs(attn.get_submodule(proj.path), _rows(proj.kind, heads, n_heads, head_dim), conv1d=layout.conv1d)
    keep_inputs(out_proj, head_index(keep, head_dim), conv1d=layout.conv1d, fold=fill)
    for paths, value in ((layout.heads, len(keep)), (layout.widths, len(keep) * head_dim), (layout.kv_groups, r)):
        for path in paths:
            owner, _, name = path.rpartition(".")
            setattr(attn.get_submodule(owner), name, value)
    if not any(p.kv for p in layout.inputs):
        return {}
    return {"kv_heads": len(kv), "kv_copies": len(kv) - len(set(kv))}


def _rows(kind: str, heads: Sequence[int], n_heads: int, head_dim: int) -> torch.Tensor:
    """The output features of `heads` in one projection of this kind.  # [parts * len(heads) * D]"""
    if kind == BLOCKED:  # [q; k; v], each H * D wide
        return torch.cat([head_index(heads, head_dim, part * n_heads * head_dim) for part in range(3)])
    if kind == INTERLEAVED:  # [q_h k_h v_h] per head, 3 * D wide
        return head_index(heads, 3 * head_dim)
    return head_index(heads, head_dim)


def _kv_heads(keep: list[int], n_heads: int, n_kv_heads: int) -> tuple[list[int], int]:
    """The key/value heads to keep, a head repeated for each r queries it serves, and r."""
    n_rep = n_heads // n_kv_heads
    sizes: dict[int, int] = {}
    for q in keep:
        sizes[q // n_rep] = sizes.get(q // n_rep, 0) + 1  # kv head -> query heads kept in its group
    r = math.gcd(*sizes.values()) if sizes else 1
    return [g for g, n in sorted(sizes.items()) for _ in range(n // r)], r  # each copy serves r queries


def head_index(heads: Sequence[int], head_dim: int, offset: int = 0) -> torch.Tensor:
    """The feature indices of `heads` (each head_dim wide), shifted by offset.  # [len(heads) * D]"""
    idx = [offset + h * head_dim + d for h in heads for d in range(head_dim)]
    return torch.tensor(idx, dtype=torch.long)


def keep_outputs(layer: nn.Module, index: torch.Tensor, *, conv1d: bool = False) -> None:
    """Keep only the output features `index` of a Linear (or Conv1D) in place."""
    with torch.no_grad():
        w = layer.weight.detach()
        new_w = (w[:, index] if conv1d else w[index]).clone()
        layer.weight = nn.Parameter(new_w, requires_grad=layer.weight.requires_grad)
        if getattr(layer, "bias", None) is not None:
            layer.bias = nn.Parameter(layer.bias.detach()[index].clone(), requires_grad=layer.bias.requires_grad)
    _set_features(layer, out=len(index), conv1d=conv1d)


def keep_inputs(layer: nn.Module, index: torch.Tensor, *, conv1d: bool = False,
                fold: torch.Tensor | None = None) -> None:
    """Keep only the input features `index` of a Linear (or Conv1D) in place.

    fold [in]: a constant input the removed features are replaced by (mean ablation); its
    contribution W[:, removed] @ fold moves into the bias, so the output is unchanged.
    """
    with torch.no_grad():
        w = layer.weight.detach()
        if fold is not None:
            dropped = torch.ones(w.shape[0] if conv1d else w.shape[1], dtype=torch.bool)
            dropped[index] = False
            full = w.t() if conv1d else w  # [out, in]
            shift = full[:, dropped].double() @ fold[dropped].double().to(w.device)  # [out]
            layer.bias = nn.Parameter((layer.bias.detach().double() + shift).to(w.dtype),
                                      requires_grad=layer.bias.requires_grad)
        new_w = (w[index] if conv1d else w[:, index]).clone()
        layer.weight = nn.Parameter(new_w, requires_grad=layer.weight.requires_grad)
    _set_features(layer, inp=len(index), conv1d=conv1d)


def _set_features(layer: nn.Module, *, out: int | None = None, inp: int | None = None, conv1d: bool) -> None:
    if conv1d:
        if out is not None:
            layer.nf = out
        if inp is not None and hasattr(layer, "nx"):
            layer.nx = inp
        return
    if out is not None and hasattr(layer, "out_features"):
        layer.out_features = out
    if inp is not None and hasattr(layer, "in_features"):
        layer.in_features = inp


