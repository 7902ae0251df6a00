"""The ordered list of adapters that find_heads tries: user adapters first, then the
built-in families, the generic softmax/SDPA adapter last."""

from __future__ import annotations

from .base import Adapter
from .layout import ProjectionLayout

_user: list[Adapter] = []


def builtin_adapters() -> list[Adapter]:
    """Built-in family adapters in the order they are tried (generic fallback excluded)."""
    from ._hf_bert import BertAdapter
    from ._hf_gpt2 import GPT2Adapter
    from ._hf_llama import LlamaAdapter
    from ._reference import ReferenceAdapter
    from ._torch_mha import MHAAdapter
    from ._transformer_lens import TransformerLensAdapter

    # TransformerLens wraps HF modules, so it goes before the HF families.
    return [ReferenceAdapter(), TransformerLensAdapter(), GPT2Adapter(), BertAdapter(), LlamaAdapter(), MHAAdapter()]


def builtin_layouts() -> list[ProjectionLayout]:
    """The projection layouts the built-in families declare as a class attribute (prune's allowlist
    of what a pruned folder may set reads them)."""
    return [a.layout for a in builtin_adapters() if isinstance(getattr(a, "layout", None), ProjectionLayout)]


def register_adapter(adapter: Adapter) -> Adapter:
    """Let find_heads try `adapter` before every built-in one (the latest registered first)."""
    for name in ("family", "find", "watch_pattern", "intervene", "blocks"):
        if not hasattr(adapter, name):
            from ..errors import ConfigError

            raise ConfigError(f"adapter {adapter!r} lacks `{name}`; see diagnose/adapters/base.py for the protocol")
    _user.insert(0, adapter)
    return adapter


def unregister_adapter(adapter: Adapter) -> None:
    """Undo register_adapter (tests and notebooks)."""
    if adapter in _user:
        _user.remove(adapter)


def adapters() -> list[Adapter]:
    """Every adapter in the order find_heads tries them."""
    return [*_user, *builtin_adapters()]
