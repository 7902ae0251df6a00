"""One adapter per model family; see base.py for the contract.

Exported: what a user needs to write and register an adapter for another family (with its
projection layout, layout.py, which lets prune cut its heads, and its norms' frozen forms, norms.py,
which let direct effects cross them). The family
modules (_reference, _torch_mha, _hf_*, _transformer_lens, _generic) and _registry are internal.
"""

from ._registry import builtin_layouts, register_adapter, unregister_adapter
from .base import Adapter, AttentionSite, HeadOutputFn, PatternCallback
from .layout import BLOCKED, INTERLEAVED, SEPARATE, Projection, ProjectionLayout, layout_of
from .norms import LAYER_NORM, RMS_NORM, NormForm, register_norm, unregister_norm

__all__ = ["BLOCKED", "INTERLEAVED", "LAYER_NORM", "RMS_NORM", "SEPARATE", "Adapter", "AttentionSite", "HeadOutputFn",
           "NormForm", "PatternCallback", "Projection", "ProjectionLayout", "builtin_layouts", "layout_of",
           "register_adapter", "register_norm", "unregister_adapter", "unregister_norm"]
