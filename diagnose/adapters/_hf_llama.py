"""Hugging Face LLaMA-style attention (LLaMA, Mistral, Qwen2, Gemma, ...): q/k/v/o_proj,
grouped-query attention (num_key_value_heads < num_attention_heads) and rotary positions
applied inside the module; output projection o_proj."""

from __future__ import annotations

import sys

import torch
import torch.nn as nn

from ._hf import HFAdapter, is_hf
from ._hooks import watch_q_k
from ._probs import LazyProbs
from .base import AttentionSite, PatternCallback
from ..errors import ConfigError
from .layout import HF_MIN_HEADS_NOTE, Projection, ProjectionLayout
from .norms import NormForm
from .readout import in_layer, named

HF_RMS_NORM = NormForm("RMSNorm (transformers)", centred=False, weight="weight", eps="variance_epsilon")
GEMMA_RMS_NORM = NormForm("Gemma RMSNorm, gain 1 + weight", centred=False, gain_offset=1.0, weight="weight", eps="eps")


class LlamaAdapter(HFAdapter):
    family = "hf-llama"
    # grouped-query attention: k_proj and v_proj hold the key/value heads, each read by a group of queries
    layout = ProjectionLayout(inputs=(Projection("q_proj"), Projection("k_proj", kv=True),
                                      Projection("v_proj", kv=True)),
                              kv_groups=("num_key_value_groups",), min_heads=1, min_heads_note=HF_MIN_HEADS_NOTE)

    def site(self, name: str, m: nn.Module):
        cfg, o_proj = getattr(m, "config", None), getattr(m, "o_proj", None)
        if cfg is None or not isinstance(o_proj, nn.Linear) or not hasattr(m, "q_proj"):
            return None
        H = getattr(cfg, "num_attention_heads", None)
        D = getattr(m, "head_dim", None)
        if not (isinstance(H, int) and isinstance(D, int)) or o_proj.in_features != H * D:
            return None
        Hkv = getattr(cfg, "num_key_value_heads", None) or H
        return H, D, (Hkv if Hkv != H else None), o_proj

    def _rebuilds(self, site: AttentionSite) -> bool:
        """Whether watch_pattern_traced rebuilds this module's scores: its own modeling file's
        apply_rotary_pos_emb, a float `scaling`, the eager or SDPA implementation (a flex
        attention BlockMask is not a tensor mask) and no logit soft-capping (Gemma 2). A sliding
        window is in the mask the module is given whenever it cuts a key."""
        m = site.module
        cfg = m.config
        return (_rope(m) is not None and isinstance(getattr(m, "scaling", None), float)
                and getattr(cfg, "_attn_implementation", None) in ("eager", "sdpa")
                and getattr(cfg, "attn_logit_softcapping", None) is None
                and all(isinstance(getattr(m, n, None), nn.Module) for n in ("q_proj", "k_proj")))

    def compile_safe(self, site: AttentionSite) -> bool:
        return self._rebuilds(site) or super().compile_safe(site)

    def watch_pattern_traced(self, site: AttentionSite, callback: PatternCallback):
        """As watch_pattern, with plain module hooks that dynamo traces into a graph (the intercept's
        torch function mode breaks it). q and k are read from the outputs of q_proj and k_proj (of
        q_norm and k_norm where the family normalises them, Qwen3, OLMo2), rotated by the module's
        own apply_rotary_pos_emb with the cos and sin it is given, and the probabilities recomputed
        with its mask and scaling as SDPA would (LazyProbs repeats key heads for grouped-query
        attention). The callback gets what the intercept gives: the whole map under the eager
        implementation, a LazyProbs otherwise. Past keys of a cache are not seen: sampling reads
        training forwards (grad enabled), which carry none."""
        if not self._rebuilds(site):  # the intercept, in the form dynamo traces (base.TRACED_HOOKS)
            return super().watch_pattern_traced(site, callback)
        m = site.module
        rope = _rope(m)
        q_src = m.q_norm if isinstance(getattr(m, "q_norm", None), nn.Module) else m.q_proj
        k_src = m.k_norm if isinstance(getattr(m, "k_norm", None), nn.Module) else m.k_proj

        def probs_of(q: torch.Tensor, k: torch.Tensor, kept: dict) -> LazyProbs | None:  # q, k [B, H(kv), T, D]
            if kept["position_embeddings"] is None:
                return None
            qr, kr = rope(q, k, *kept["position_embeddings"])  # cos, sin
            return LazyProbs(qr, kr, kept["attention_mask"], is_causal=bool(getattr(m, "is_causal", True)),
                             scale=m.scaling)

        return watch_q_k(m, q_src, k_src, site.head_dim, {"position_embeddings": 1, "attention_mask": 2}, probs_of,
                         m.config._attn_implementation == "eager", callback)

    def norm_form(self, norm: nn.Module) -> NormForm | None:
        """Its families' own RMSNorms (norms.py): LlamaRMSNorm and its copies (weight * x / rms, eps as
        variance_epsilon); Gemma's multiplies by (1 + weight), eps as eps."""
        name = type(norm).__name__
        if not (is_hf(norm) and name.endswith("RMSNorm")):
            return None
        return GEMMA_RMS_NORM if name.startswith("Gemma") else HF_RMS_NORM

    def final_norm(self, model: nn.Module) -> nn.Module:
        """model.norm: pre-norm, each o_proj output added to the stream (readout.py). Families that norm the
        attention output before adding it (Gemma 2 and 3: post_feedforward_layernorm) have no such path."""
        if any(n.endswith("post_feedforward_layernorm") for n, _ in model.named_modules()):
            raise ConfigError("this model norms each sublayer's output before the residual add (Gemma 2/3 style), "
                              "so a head's direct path is not a subtraction; direct effects are not measured")
        return named(model, "norm", "LLaMA")

    def mlp(self, model: nn.Module, site: AttentionSite) -> nn.Module:
        """layers.{i}.mlp: it reads post_attention_layernorm of the stream after self_attn wrote; its output
        is added. A mixture of experts (Mixtral's block_sparse_moe, a router's logits returned beside the
        write) is not declared: its layer's nodes are its heads."""
        found = in_layer(model, site, "mlp", "LLaMA")
        if "Moe" in type(found).__name__ or hasattr(found, "experts"):
            raise ConfigError(f"{site.name}: its layer's MLP is a mixture of experts ({type(found).__name__})")
        return found


def _rope(m: nn.Module):
    """The rotary function of the module's own modeling file (each family keeps its own copy)."""
    return getattr(sys.modules.get(type(m).__module__), "apply_rotary_pos_emb", None)
