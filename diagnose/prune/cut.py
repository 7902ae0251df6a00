"""Physically removing the chosen heads: a copy of the model with smaller projections.

One cutter per family (the _cut_* files); this file picks it, copies the model (the input is
never touched) and says what changed: the new parameter shapes and module attributes, which is
what a saved Hugging Face folder needs to be rebuilt (save.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn as nn

from ..adapters.base import AttentionSite
from ..errors import ConfigError
from . import _cut_bert, _cut_generic, _cut_gpt2, _cut_llama, _cut_reference, _slice

CUTTERS = {"reference": _cut_reference.cut, "hf-bert": _cut_bert.cut, "hf-gpt2": _cut_gpt2.cut,
           "hf-llama": _cut_llama.cut, "generic": _cut_generic.cut}
# transformers reshapes head outputs with view(..., -1, head_dim), which an empty layer cannot do:
# a Hugging Face layer keeps at least one head. The others may lose all (the bias path stays exact).
MIN_HEADS = {"hf-bert": 1, "hf-gpt2": 1, "hf-llama": 1}
# Every module attribute a cut may change, and so all that a pruned folder's `diagnose_pruned` may
# set when it is loaded (_spec.py refuses any other name: a config must not reach a method).
ATTRIBUTES = frozenset(_slice.ATTRIBUTES + _cut_bert.ATTRIBUTES + _cut_gpt2.ATTRIBUTES + _cut_llama.ATTRIBUTES
                       + _cut_reference.ATTRIBUTES)


@dataclass
class Cut:
    """The pruned copy, and how it differs from the original."""

    model: nn.Module
    heads_left: list[int]
    shapes: dict[str, list[int]] = field(default_factory=dict)  # parameter name -> new shape
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)  # module name -> changed int attributes
    notes: dict[int, dict] = field(default_factory=dict)  # layer -> what its cutter says (GQA copies)


def family_of(sites: Sequence[AttentionSite]) -> str:
    return sites[0].adapter.family if sites else "unknown"


def check_cuttable(model: nn.Module, sites: Sequence[AttentionSite], method: str) -> None:
    """Raise ConfigError (one line) before any measuring when the chosen heads could not be cut."""
    family = family_of(sites)
    if family not in CUTTERS:
        raise ConfigError(f"{type(model).__name__}: heads of the {family!r} family cannot be cut (diagnose cuts "
                          f"{', '.join(sorted(CUTTERS))}); the heads command still measures them")
    shared = [s.name for s in sites if s.application is not None]
    if shared:
        raise ConfigError(f"{shared[0]}: one attention module is shared across depths; its heads cannot be cut "
                          "at one depth only")
    if any(s.out_proj is None for s in sites):
        raise ConfigError(f"{type(model).__name__}: no output projection found for every attention layer; "
                          "its heads cannot be cut")
    if method == "mean" and any(getattr(s.out_proj, "bias", None) is None for s in sites):
        raise ConfigError(f"{type(model).__name__}: --method mean folds each removed head's mean output into "
                          "the output projection's bias, and this model's has none; use --method zero")


def cut(model: nn.Module, sites: Sequence[AttentionSite], removed: Sequence[tuple[int, int]],
        fills: Sequence[torch.Tensor | None] | None = None) -> Cut:
    """A copy of `model` without the `removed` (layer, head) pairs. fills: per site the [H, D] mean
    outputs the removed heads were replaced by (mean ablation), folded into the output bias."""
    family = family_of(sites)
    names = {id(m): n for n, m in model.named_modules()}
    pruned = copy.deepcopy(model)
    modules = dict(pruned.named_modules())
    gone: dict[int, set[int]] = {}
    for layer, head in removed:
        gone.setdefault(int(layer), set()).add(int(head))
    result = Cut(pruned, [s.n_heads - len(gone.get(s.layer, ())) for s in sites])
    for site in sites:
        if site.layer not in gone:
            continue
        keep = [h for h in range(site.n_heads) if h not in gone[site.layer]]
        fill = None if fills is None or fills[site.layer] is None else fills[site.layer].detach().reshape(-1)
        note = CUTTERS[family](modules[names[id(site.module)]], modules[names[id(site.out_proj)]], keep,
                               site.n_heads, site.head_dim, fill)
        if note:
            result.notes[site.layer] = note
    _changes(model, pruned, result)
    cfg = getattr(pruned, "cfg", None)
    if family == "reference" and cfg is not None:  # the checkpoint's config rebuilds the pruned shapes
        pruned.cfg = copy.deepcopy(cfg)
        pruned.cfg.layer_heads = list(result.heads_left)
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
