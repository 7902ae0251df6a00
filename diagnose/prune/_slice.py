"""Slicing heads out of projections: the one cutter every family's declared layout drives.

A head h of width D owns D output features of each query, key and value projection (where they
sit is the family's ProjectionLayout: separate, blocked or interleaved) and the same D input
features of the output projection. nn.Linear stores weight [out, in]; Hugging Face's Conv1D
(GPT-2) stores weight [in, out], the transpose.

Grouped-query attention: query head q reads key/value head q // n_rep. A key/value head goes only
when its whole group of query heads goes; one whose group keeps any query is kept whole, once. The
groups left must be the same size (transformers repeats every key/value head num_key_value_groups
times); when they are not, each smaller group is padded to the largest with empty query slots (a
removed query's place, its q rows and output-projection columns zeroed, so it adds exactly 0). The
padding costs what copying key/value heads would, but the layer never grows: at most n_rep query
slots per key/value head kept, as the original had.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn

from ..adapters.layout import BLOCKED, INTERLEAVED, ProjectionLayout

FEATURES = ("in_features", "out_features", "nf", "nx")  # what a cut Linear or Conv1D changes


def cut_heads(attn: nn.Module, out_proj: nn.Module, layout: ProjectionLayout, keep: list[int], n_heads: int,
              n_kv_heads: int, head_dim: int, fill: torch.Tensor | None) -> dict:
    """Keep only the query heads `keep` of one attention module (in place), as `layout` declares it.

    fill [H * D]: the removed heads' mean outputs (mean ablation), folded into the output bias.
    Returns what the result notes (grouped-query attention: key/value heads kept, query slots, of them padding),
    else {}.
    """
    keep = sorted(keep)
    kv, slots = _groups(keep, n_heads, n_kv_heads) if any(p.kv for p in layout.inputs) else ([], keep)
    blank = [i for i, h in enumerate(slots) if h not in keep]  # padding slots: zeroed, they add nothing
    for proj in layout.inputs:
        heads = kv if proj.kv else slots
        keep_outputs(attn.get_submodule(proj.path), _rows(proj.kind, heads, n_heads, head_dim), conv1d=layout.conv1d)
        if not proj.kv and blank:
            _zero(attn.get_submodule(proj.path), head_index(blank, head_dim), conv1d=layout.conv1d, outputs=True)
    if fill is not None:
        fold_inputs(out_proj, head_index(keep, head_dim), fill, conv1d=layout.conv1d)
    keep_inputs(out_proj, head_index(slots, head_dim), conv1d=layout.conv1d)
    if blank:
        _zero(out_proj, head_index(blank, head_dim), conv1d=layout.conv1d, outputs=False)
    r = len(slots) // max(len(kv), 1)
    for paths, value in ((layout.heads, len(slots)), (layout.widths, len(slots) * head_dim), (layout.kv_groups, r)):
        for path in paths:
            owner, _, name = path.rpartition(".")
            setattr(attn.get_submodule(owner), name, value)
    if not any(p.kv for p in layout.inputs):
        return {}
    return {"kv_heads": len(kv), "query_slots": len(slots), "padded": len(blank)}


def _rows(kind: str, heads: Sequence[int], n_heads: int, head_dim: int) -> torch.Tensor:
    """The output features of `heads` in one projection of this kind.  # [parts * len(heads) * D]"""
    if kind == BLOCKED:  # [q; k; v], each H * D wide
        return torch.cat([head_index(heads, head_dim, part * n_heads * head_dim) for part in range(3)])
    if kind == INTERLEAVED:  # [q_h k_h v_h] per head, 3 * D wide
        return head_index(heads, 3 * head_dim)
    return head_index(heads, head_dim)


def _groups(keep: list[int], n_heads: int, n_kv_heads: int) -> tuple[list[int], list[int]]:
    """The key/value heads kept (each once: those whose group keeps a query) and the query slots, group by
    group: its kept queries, then removed ones of the same group as padding up to the largest group left."""
    n_rep = n_heads // n_kv_heads
    groups: dict[int, list[int]] = {}
    for q in keep:
        groups.setdefault(q // n_rep, []).append(q)
    r = max((len(g) for g in groups.values()), default=0)
    slots = []
    for g, kept in sorted(groups.items()):
        spare = [q for q in range(g * n_rep, (g + 1) * n_rep) if q not in kept]
        slots += sorted(kept + spare[:r - len(kept)])
    return sorted(groups), slots


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


def fold_inputs(layer: nn.Module, kept: torch.Tensor, fold: torch.Tensor, *, conv1d: bool = False) -> None:
    """Move the contribution W[:, removed] @ fold of the input features not in `kept` into the bias (in
    place): fold [in] is the constant those features are replaced by (mean ablation), so once they are cut
    the output is unchanged."""
    with torch.no_grad():
        w = layer.weight.detach()
        dropped = torch.ones(w.shape[0] if conv1d else w.shape[1], dtype=torch.bool)
        dropped[kept] = False
        full = w.t() if conv1d else w  # [out, in]
        shift = full[:, dropped].double() @ fold[dropped].double().to(w.device)  # [out]
        layer.bias = nn.Parameter((layer.bias.detach().double() + shift).to(w.dtype),
                                  requires_grad=layer.bias.requires_grad)


def keep_inputs(layer: nn.Module, index: torch.Tensor, *, conv1d: bool = False) -> None:
    """Keep only the input features `index` of a Linear (or Conv1D) in place."""
    with torch.no_grad():
        w = layer.weight.detach()
        new_w = (w[index] if conv1d else w[:, index]).clone()
        layer.weight = nn.Parameter(new_w, requires_grad=layer.weight.requires_grad)
    _set_features(layer, inp=len(index), conv1d=conv1d)


def _zero(layer: nn.Module, index: torch.Tensor, *, conv1d: bool, outputs: bool) -> None:
    """Zero the output (or input) features `index` of a Linear (or Conv1D) in place, bias included."""
    with torch.no_grad():
        if outputs != conv1d:  # nn.Linear holds [out, in]: outputs are its rows; Conv1D the transpose
            layer.weight[index] = 0
        else:
            layer.weight[:, index] = 0
        if outputs and getattr(layer, "bias", None) is not None:
            layer.bias[index] = 0


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


