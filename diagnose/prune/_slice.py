"""Slicing head rows out of projections: what every family's cut is made of.

A head h of width D owns rows h*D:(h+1)*D of each of the query, key and value projections
(their outputs) and the same columns of the output projection (its input). nn.Linear stores
weight [out, in]; Hugging Face's Conv1D (GPT-2) stores weight [in, out], the transpose.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn


ATTRIBUTES = ("in_features", "out_features", "nf", "nx")  # what a cut Linear or Conv1D changes

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


