"""Physically removing the chosen heads: a copy of the model with smaller projections.

Each family's adapter declares its projection layout (diagnose/adapters/layout.py); one slicer
(_slice.py) cuts every family from it. This file copies the model (the input is never touched),
cuts each site and says what changed: the new parameter shapes and module attributes, which is
what a saved Hugging Face folder needs to be rebuilt (save.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import reduce
from typing import Any, Sequence

import torch
import torch.nn as nn

from ..adapters import builtin_layouts
from ..adapters.base import AttentionSite
from ..adapters.layout import ProjectionLayout, layout_of
from ..errors import ConfigError
from ._slice import FEATURES, cut_heads

# Every module attribute a cut of a built-in family may change, and so all that a pruned folder's
# `diagnose_pruned` may set when it is loaded (_spec.py refuses any other name: a config must not
# reach a method). _remote_model.ATTRIBUTES repeats it for transformers (a test keeps them equal).
ATTRIBUTES = frozenset(FEATURES + tuple(a for layout in builtin_layouts() for a in layout.attributes))
# of those, the head counts (heads kept, query heads per key/value head) and the widths (heads * head_dim)
HEAD_COUNTS = frozenset(p.rpartition(".")[2] for layout in builtin_layouts() for p in layout.heads + layout.kv_groups)
WIDTHS = frozenset(p.rpartition(".")[2] for layout in builtin_layouts() for p in layout.widths)


@dataclass
class Cut:
    """The pruned copy, and how it differs from the original."""

    model: nn.Module
    heads_left: list[int]
    shapes: dict[str, list[int]] = field(default_factory=dict)  # parameter name -> new shape
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)  # module name -> changed int attributes
    notes: dict[int, dict] = field(default_factory=dict)  # layer -> what the slicer says (GQA copies)


def family_of(sites: Sequence[AttentionSite]) -> str:
    return sites[0].adapter.family if sites else "unknown"


def check_cuttable(model: nn.Module, sites: Sequence[AttentionSite], method: str) -> list[ProjectionLayout]:
    """Each site's layout; ConfigError (one line) before any measuring when the heads could not be cut."""
    shared = [s.name for s in sites if s.application is not None]
    if shared:
        raise ConfigError(f"{shared[0]}: one attention module is shared across depths; its heads cannot be cut "
                          "at one depth only")
    if any(s.out_proj is None for s in sites):
        raise ConfigError(f"{type(model).__name__}: no output projection found for every attention layer; "
                          "its heads cannot be cut")
    try:
        layouts = [layout_of(s) for s in sites]
    except ConfigError as exc:
        raise ConfigError(f"{type(model).__name__}: {exc}") from None
    if method == "mean" and any(getattr(s.out_proj, "bias", None) is None for s in sites):
        raise ConfigError(f"{type(model).__name__}: --method mean folds each removed head's mean output into "
                          "the output projection's bias, and this model's has none; use --method zero")
    return layouts


def min_heads(layouts: Sequence[ProjectionLayout]) -> int:
    """The fewest heads every layer must keep (the strictest layout's)."""
    return max((layout.min_heads for layout in layouts), default=0)


def cut(model: nn.Module, sites: Sequence[AttentionSite], removed: Sequence[tuple[int, int]],
        fills: Sequence[torch.Tensor | None] | None = None) -> Cut:
    """A copy of `model` without the `removed` (layer, head) pairs. fills: per site the [H, D] mean
    outputs the removed heads were replaced by (mean ablation), folded into the output bias."""
    layouts = check_cuttable(model, sites, "zero")
    names = {id(m): n for n, m in model.named_modules()}
    pruned = copy.deepcopy(model)
    modules = dict(pruned.named_modules())
    gone: dict[int, set[int]] = {}
    for layer, head in removed:
        gone.setdefault(int(layer), set()).add(int(head))
    result = Cut(pruned, [s.n_heads - len(gone.get(s.layer, ())) for s in sites])
    for site, layout in zip(sites, layouts):
        if site.layer not in gone:
            continue
        keep = [h for h in range(site.n_heads) if h not in gone[site.layer]]
        fill = None if fills is None or fills[site.layer] is None else fills[site.layer].detach().reshape(-1)
        note = cut_heads(modules[names[id(site.module)]], modules[names[id(site.out_proj)]], layout, keep,
                         site.n_heads, site.n_kv_heads or site.n_heads, site.head_dim, fill)
        if note:
            result.notes[site.layer] = note
    _changes(model, pruned, result)
    for path in {layout.model_heads for layout in layouts if layout.model_heads}:
        owner, _, name = path.rpartition(".")  # a config that rebuilds the pruned shapes (the checkpoint's)
        holder = reduce(getattr, owner.split("."), pruned) if owner else pruned
        setattr(holder, name, list(result.heads_left))
    return result


def _changes(before: nn.Module, after: nn.Module, out: Cut) -> None:
    """The parameter shapes and integer module attributes the cut changed."""
    old = dict(before.named_parameters())
    for name, p in after.named_parameters():
        if tuple(old[name].shape) != tuple(p.shape):
            out.shapes[name] = list(p.shape)
    old_modules = dict(before.named_modules())
    for name, m in after.named_modules():
        was = old_modules[name].__dict__
        changed = {k: v for k, v in m.__dict__.items()
                   if isinstance(v, int) and not isinstance(v, bool) and k in was and was[k] != v}
        if changed:
            out.attributes[name] = changed
