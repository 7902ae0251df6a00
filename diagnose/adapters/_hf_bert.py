"""Hugging Face BERT family (BERT, RoBERTa, XLM-R, ELECTRA, MiniLM, ...): the site is the
`*Attention` module holding `.self` (heads) and `.output.dense` (the output projection)."""

from __future__ import annotations

import torch
import torch.nn as nn

from ._hf import HFAdapter
from ._hooks import watch_q_k
from ._probs import LazyProbs
from .base import AttentionSite, PatternCallback
from ..errors import ConfigError
from .layout import HF_MIN_HEADS_NOTE, Projection, ProjectionLayout
from .readout import ResidualPath


class BertAdapter(HFAdapter):
    family = "hf-bert"
    layout = ProjectionLayout(inputs=(Projection("self.query"), Projection("self.key"), Projection("self.value")),
                              heads=("self.num_attention_heads",), widths=("self.all_head_size",),
                              min_heads=1, min_heads_note=HF_MIN_HEADS_NOTE)

    def site(self, name: str, m: nn.Module):
        inner, out = getattr(m, "self", None), getattr(m, "output", None)
        if inner is None or out is None or not isinstance(getattr(out, "dense", None), nn.Linear):
            return None
        H, D = getattr(inner, "num_attention_heads", None), getattr(inner, "attention_head_size", None)
        if not (isinstance(H, int) and isinstance(D, int)):
            return None
        return H, D, None, out.dense

    def _rebuilds(self, site: AttentionSite) -> bool:
        """Whether watch_pattern_traced rebuilds this module's scores: self-attention (not
        cross-attention) with query and key projections, a float `scaling`, absolute positions
        (no relative-position term in the scores) and the eager or SDPA implementation."""
        inner = site.module.self
        cfg = getattr(inner, "config", None)
        return (not type(inner).__name__.endswith("CrossAttention") and cfg is not None
                and all(isinstance(getattr(inner, n, None), nn.Linear) for n in ("query", "key"))
                and isinstance(getattr(inner, "scaling", None), float)
                and getattr(cfg, "position_embedding_type", "absolute") in (None, "absolute")
                and getattr(cfg, "_attn_implementation", None) in ("eager", "sdpa"))

    def compile_safe(self, site: AttentionSite) -> bool:
        return self._rebuilds(site) or super().compile_safe(site)

    def watch_pattern_traced(self, site: AttentionSite, callback: PatternCallback):
        """As watch_pattern, with plain module hooks that dynamo traces into a graph (the intercept's
        torch function mode breaks it): q and k from the outputs of `self.query` and `self.key`, the
        mask from the self-attention's keywords, the probabilities recomputed as SDPA would
        (LazyProbs). The callback gets the whole map under the eager implementation, a LazyProbs
        otherwise. Past keys of a cache are not seen: sampling reads training forwards."""
        if not self._rebuilds(site):  # the intercept, in the form dynamo traces (base.TRACED_HOOKS)
            return super().watch_pattern_traced(site, callback)
        inner = site.module.self

        def probs_of(q: torch.Tensor, k: torch.Tensor, kept: dict) -> LazyProbs:  # q, k [B, H, T, D]
            return LazyProbs(q, k, kept["attention_mask"], is_causal=bool(getattr(inner, "is_causal", False)),
                             scale=inner.scaling)

        return watch_q_k(inner, inner.query, inner.key, site.head_dim, {"attention_mask": 1}, probs_of,
                         inner.config._attn_implementation == "eager", callback)

    def residual_path(self, model: nn.Module, site) -> ResidualPath:
        """Post-norm: the head's write passes its layer's attention-output LayerNorm and output LayerNorm,
        then both of every later layer's, before it reaches the encoder's output (readout.py)."""
        for encoder in model.modules():
            layers = getattr(encoder, "layer", None)
            if not isinstance(layers, nn.ModuleList):
                continue
            at = [l for l, layer in enumerate(layers) if getattr(layer, "attention", None) is site.module]
            if not at:
                continue
            if [n for n, _ in encoder.named_children()] != ["layer"]:
                raise ConfigError(f"{type(encoder).__name__} holds more than its layers, so a head's path to the "
                                  "output is not known and direct effects are not measured")
            norms = []
            for layer in layers[at[0]:]:
                pair = (getattr(getattr(layer, "attention", None), "output", None), getattr(layer, "output", None))
                if hasattr(layer, "crossattention") or not all(
                        isinstance(getattr(p, "LayerNorm", None), nn.LayerNorm) for p in pair):
                    raise ConfigError(f"{type(layer).__name__} is not a post-norm encoder layer (a LayerNorm after "
                                      "its attention and after its MLP, no cross-attention), so direct effects are "
                                      "not measured")
                norms += [p.LayerNorm for p in pair]
            return ResidualPath(tuple(norms), encoder)
        raise ConfigError(f"{site.name} is not the self-attention of an encoder's layer, so its path to the output "
                          "is not known and direct effects are not measured")
