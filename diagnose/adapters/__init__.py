"""One adapter per model family; see base.py for the contract.

Exported: what a user needs to write and register an adapter for another family. The family
modules (_reference, _torch_mha, _hf_*, _transformer_lens, _generic) and _registry are internal.
"""

from ._registry import register_adapter, unregister_adapter
from .base import Adapter, AttentionSite, HeadOutputFn, PatternCallback

__all__ = ["Adapter", "AttentionSite", "HeadOutputFn", "PatternCallback", "register_adapter", "unregister_adapter"]
