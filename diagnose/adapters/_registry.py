"""The ordered adapters that find_heads tries: user adapters first (the latest registered first),
then the built-in families, the generic softmax/SDPA adapter last (it is not an entry: sites.py
builds it for the model at hand). One `Registry` (diagnose/registry.py), keyed by `family`."""

from __future__ import annotations

from ..errors import ConfigError
from ..registry import Registry
from .base import Adapter
from .layout import ProjectionLayout

PROTOCOL = ("family", "find", "watch_pattern", "intervene", "blocks")  # what an adapter must have (base.py)


def _builtins() -> list[Adapter]:
    """Built-in family adapters in the order they are tried (generic fallback excluded); imported on
    first use, so that importing the adapters package does not import every family."""
    from ._hf_bert import BertAdapter
    from ._hf_gpt2 import GPT2Adapter
    from ._hf_llama import LlamaAdapter
    from ._reference import ReferenceAdapter
    from ._torch_mha import MHAAdapter
    from ._transformer_lens import TransformerLensAdapter

    # TransformerLens wraps HF modules, so it goes before the HF families.
    return [ReferenceAdapter(), TransformerLensAdapter(), GPT2Adapter(), BertAdapter(), LlamaAdapter(), MHAAdapter()]


def _check(adapter: Adapter) -> None:
    for name in PROTOCOL:
        if not hasattr(adapter, name):
            raise ConfigError(f"adapter {adapter!r} lacks `{name}`; see diagnose/adapters/base.py for the protocol")


REGISTRY: Registry[Adapter] = Registry("adapter family", key=lambda a: a.family, check=_check, builtins=_builtins,
                                       newest_first=True)


def builtin_adapters() -> list[Adapter]:
    """Built-in family adapters in the order they are tried (generic fallback excluded)."""
    return list(REGISTRY.builtin())


def builtin_layouts() -> list[ProjectionLayout]:
    """The projection layouts the built-in families declare as a class attribute (prune's allowlist
    of what a pruned folder may set reads them)."""
    return [a.layout for a in builtin_adapters() if isinstance(getattr(a, "layout", None), ProjectionLayout)]


def register_adapter(adapter: Adapter, *, replace: bool = False) -> Adapter:
    """Let find_heads try `adapter` before every built-in one (the latest registered first); its
    `family` must be new (replace=True puts it in place of the adapter of that family, a built-in one
    included, and tries it first)."""
    return REGISTRY.register(adapter, replace=replace)


def unregister_adapter(adapter: Adapter) -> None:
    """Undo register_adapter (tests and notebooks)."""
    family = getattr(adapter, "family", None)
    if family in REGISTRY and REGISTRY.get(family) is adapter:
        REGISTRY.unregister(family)


def adapters() -> list[Adapter]:
    """Every adapter in the order find_heads tries them."""
    return list(REGISTRY.entries())
