"""What the Hugging Face family adapters share: recognising transformers' own modules
without importing transformers (slow), and the intercept mechanics (eager softmax or
SDPA recompute), so "eager" and "sdpa" both work without the user switching anything."""

from __future__ import annotations

from abc import abstractmethod

import torch.nn as nn

from .base import AttentionSite
from ._generic import InterceptAdapter


def is_hf(module: nn.Module, class_suffix: str = "") -> bool:
    """A module defined by transformers whose class name ends with class_suffix."""
    cls = type(module)
    return cls.__module__.startswith("transformers.") and cls.__name__.endswith(class_suffix)


class HFAdapter(InterceptAdapter):
    """Subclasses say which modules are sites: `site(name, module)` returns (H, D, Hkv, out_proj) or None."""

    @abstractmethod
    def site(self, name: str, module: nn.Module):
        """(n_heads, head_dim, n_kv_heads, out_proj) when `module` is one of this family's attention modules."""

    def output_layer(self, model: nn.Module) -> nn.Module | None:
        """The per-position output layer (ablation/scored.py): the model's own get_output_embeddings()
        (a causal LM's lm_head, an MLM head's decoder); None for a model without one (a classifier)."""
        get = getattr(model, "get_output_embeddings", None)
        out = get() if callable(get) else None
        return out if isinstance(out, nn.Module) else None

    def find(self, model: nn.Module) -> list[AttentionSite] | None:
        sites = []
        for name, m in model.named_modules():
            spec = self.site(name, m) if is_hf(m) else None
            if spec is not None:
                H, D, Hkv, proj = spec
                sites.append(AttentionSite(len(sites), name, H, D, m, self, n_kv_heads=Hkv, out_proj=proj))
        return sites or None
