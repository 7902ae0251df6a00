"""One adapter per model family; see base.py for the contract."""

from .base import Adapter, AttentionSite, HeadOutputFn, PatternCallback
from .registry import adapters, register_adapter, unregister_adapter

__all__ = ["Adapter", "AttentionSite", "HeadOutputFn", "PatternCallback", "adapters", "register_adapter",
           "unregister_adapter"]
