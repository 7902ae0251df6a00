"""One adapter per model family; see base.py for the contract.

Exported: what a user needs to write and register an adapter for another family. The family
modules (reference, torch_mha, hf_*, transformer_lens, generic) and the registry are internal.
"""

from .base import Adapter, AttentionSite, HeadOutputFn, PatternCallback
from .registry import register_adapter, unregister_adapter

__all__ = ["Adapter", "AttentionSite", "HeadOutputFn", "PatternCallback", "register_adapter", "unregister_adapter"]
