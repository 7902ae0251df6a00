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

NAMING_HINT = ("name them once: CLI `--attention-module NAME --heads N` (NAME is the attention module's class, "
               "e.g. 'Attention', a glob over qualified module names, e.g. 'encoder.layers.*.attn', or 're:REGEX'), "
               "in Python find_heads(model, attention_module=NAME, n_heads=N), or register an adapter "
               "(diagnose.register_adapter) built on diagnose.adapters.InterceptAdapter (docs/families.md)")


def find_heads(model: nn.Module, *, attention_module: str | None = None, n_heads: int | None = None,
               example: Any = None) -> list[AttentionSite]:
    """One AttentionSite per attention layer, in forward order.

    attention_module (the attention module's class name, a glob over qualified module names, or
    `re:REGEX`; adapters/_generic.matching_modules) and n_heads name layers diagnose cannot
    recognise; a named module that computes no softmax is refused. `example` (model inputs: a
    Tensor, a Mapping of keyword arguments) is what the generic fallback traces the model on; without
    one only a model starting with an nn.Embedding can be traced (on token ids). A module applied several times per forward (ALBERT's
    shared layer) gives one site per application, named `NAME#k` (see adapters/shared.py).
    """
    if attention_module is not None:
        return split_shared(model, named_sites(model, attention_module, n_heads, example), example)
    generic = GenericAdapter(example)
    for adapter in [*adapters(), generic]:
        sites = adapter.find(model)
        if sites:
            return split_shared(model, sites, example)
    why = generic.failure or ("no softmax over [B, H, Tq, Tk] or scaled_dot_product_attention call seen in a "
                              f"traced forward{'' if example is not None else ' on guessed token ids: pass example=inputs'}")
    raise NoAttentionFoundError(f"no attention layer found in {type(model).__name__} ({why}); {NAMING_HINT}")
