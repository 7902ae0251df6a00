"""One adapter per model family; see base.py for the contract.

Exported: what a user needs to write and register an adapter for another family (with its
projection layout, layout.py, which lets prune cut its heads), and the hook helpers the other
packages use (hooks, LazyProbs, sdpa_probs, mode_inside, no_fastpath). The family
modules (_reference, _torch_mha, _hf_*, _transformer_lens, _generic) and _registry are internal.
"""

from ._hooks import hooks
from ._intercept import mode_inside, sdpa_probs
from ._probs import LazyProbs
from ._registry import builtin_layouts, register_adapter, unregister_adapter
from ._torch_mha import no_fastpath
from .base import Adapter, AttentionSite, HeadOutputFn, PatternCallback
from .layout import BLOCKED, INTERLEAVED, SEPARATE, Projection, ProjectionLayout, layout_of

__all__ = ["BLOCKED", "INTERLEAVED", "SEPARATE", "Adapter", "AttentionSite", "HeadOutputFn", "PatternCallback",
           "Projection", "ProjectionLayout", "builtin_layouts", "layout_of", "register_adapter", "unregister_adapter",
           # what other packages of diagnose use: hooks removed in `finally`, lazily computed probabilities,
           # SDPA's probabilities and the mode that intercepts it inside a module, MHA without its fast path
           "hooks", "LazyProbs", "sdpa_probs", "mode_inside", "no_fastpath"]
