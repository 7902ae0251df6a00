"""One adapter per model family; see base.py for the contract.

Exported: what a user needs to write and register an adapter for another family (with its
projection layout, layout.py, which lets prune cut its heads); InterceptAdapter is the base class
for attention that computes a softmax or calls F.scaled_dot_product_attention (docs/families.md). The family
modules (_reference, _torch_mha, _hf_*, _transformer_lens, _generic) and _registry are internal.
"""

from ._generic import InterceptAdapter
from ._registry import builtin_layouts, register_adapter, unregister_adapter
from .base import Adapter, AttentionSite, HeadOutputFn, PatternCallback
from .layout import BLOCKED, INTERLEAVED, SEPARATE, Projection, ProjectionLayout, layout_of

__all__ = ["BLOCKED", "INTERLEAVED", "SEPARATE", "Adapter", "AttentionSite", "HeadOutputFn", "InterceptAdapter", "PatternCallback",
           "Projection", "ProjectionLayout", "builtin_layouts", "layout_of", "register_adapter", "unregister_adapter"]
