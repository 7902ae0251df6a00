"""One adapter per model family; see base.py for the contract.

Exported: what a user needs to write and register an adapter for another family (with its
projection layout, layout.py, which lets prune cut its heads, and its norms' frozen forms, norms.py,
which let direct effects cross them); InterceptAdapter is the base class for attention that computes
a softmax or calls F.scaled_dot_product_attention (docs/families.md); and the hook helpers the other
modules use (all_adapters, GenericAdapter, hooks, LazyProbs, sdpa_probs, ...: see __all__). The family
modules (_reference, _torch_mha, _hf_*, _transformer_lens, _generic) and _registry are internal.
"""

from ._generic import GenericAdapter, InterceptAdapter, named_sites
from ._hooks import first_tensor, hooks
from ._stream import trace_calls
from ._intercept import mode_inside, sdpa_probs
from ._probs import LazyProbs, Probs, float32_only, materialise, query_chunks
from ._stream import StreamPlan, stream_plan
from ._registry import adapters as all_adapters, builtin_layouts, register_adapter, unregister_adapter
from ._torch_mha import no_fastpath
from ._trace import Called
from .base import Adapter, AttentionSite, HeadOutputFn, PatternCallback
from .layout import BLOCKED, INTERLEAVED, SEPARATE, Projection, ProjectionLayout, layout_of, stored_in_out
from .norms import LAYER_NORM, RMS_NORM, NormForm, register_norm, unregister_norm

__all__ = ["BLOCKED", "INTERLEAVED", "LAYER_NORM", "RMS_NORM", "SEPARATE", "Adapter", "AttentionSite", "HeadOutputFn",
           "InterceptAdapter", "NormForm", "PatternCallback", "Projection", "ProjectionLayout", "builtin_layouts",
           "layout_of", "register_adapter", "register_norm", "unregister_adapter", "unregister_norm",
           # what the rest of diagnose uses: every adapter in the order tried, the generic fallback, hooks
           # removed in `finally`, lazily computed probabilities and their chunks, SDPA's probabilities and
           # the mode that intercepts it inside a module, MHA without its fast path, the traced residual stream
           "all_adapters", "GenericAdapter", "named_sites", "hooks", "first_tensor", "trace_calls", "LazyProbs", "Probs",
           "float32_only", "materialise", "query_chunks", "sdpa_probs", "mode_inside", "no_fastpath",
           "StreamPlan", "stream_plan", "stored_in_out", "Called"]
