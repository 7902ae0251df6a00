"""find_heads: the attention layers of any model, in forward order, each with the adapter
that knows its family. Adapters are tried in order (user-registered, built-in families,
the generic softmax/SDPA tracer last); the first that recognises the model wins."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from .adapters.base import AttentionSite
from .adapters import GenericAdapter, named_sites
from .adapters import all_adapters as adapters, register_adapter, unregister_adapter
from .adapters.shared import split_shared
from .errors import NoAttentionFoundError

__all__ = ["find_heads", "register_adapter", "unregister_adapter", "NAMING_HINT"]

NAMING_HINT = ("name them once: CLI `--attention-module NAME --heads N` (NAME is a glob over qualified "
               "module names, e.g. 'encoder.layers.*.attn'), in Python "
               "find_heads(model, attention_module=NAME, n_heads=N), or register an adapter with "
               "diagnose.register_adapter (see diagnose/adapters/base.py)")


def find_heads(model: nn.Module, *, attention_module: str | None = None, n_heads: int | None = None,
               example: Any = None) -> list[AttentionSite]:
    """One AttentionSite per attention layer, in forward order.

    attention_module (a glob over qualified module names) and n_heads name layers diagnose
    cannot recognise. `example` (model inputs) lets the generic fallback trace the model with
    real inputs instead of guessed token ids. A module applied several times per forward (ALBERT's
    shared layer) gives one site per application, named `NAME#k` (see adapters/shared.py).
    """
    if attention_module is not None:
        return split_shared(model, named_sites(model, attention_module, n_heads, example), example)
    for adapter in [*adapters(), GenericAdapter(example)]:
        sites = adapter.find(model)
        if sites:
            return split_shared(model, sites, example)
    raise NoAttentionFoundError(f"no attention layer found in {type(model).__name__} (no softmax over "
                                f"[B, H, Tq, Tk] or scaled_dot_product_attention call seen"
                                f"{'' if example is not None else ' on guessed inputs: pass example=inputs'}); {NAMING_HINT}")
