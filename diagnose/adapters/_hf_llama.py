"""Hugging Face LLaMA-style attention (LLaMA, Mistral, Qwen2, Gemma, ...): q/k/v/o_proj,
grouped-query attention (num_key_value_heads < num_attention_heads) and rotary positions
applied inside the module; output projection o_proj."""

from __future__ import annotations

import torch.nn as nn

from ._hf import HFAdapter
from ..errors import ConfigError
from .readout import named
from .layout import HF_MIN_HEADS_NOTE, Projection, ProjectionLayout


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

    def final_norm(self, model: nn.Module) -> nn.Module:
        """model.norm: pre-norm, each o_proj output added to the stream (readout.py). Families that norm the
        attention output before adding it (Gemma 2 and 3: post_feedforward_layernorm) have no such path."""
        if any(n.endswith("post_feedforward_layernorm") for n, _ in model.named_modules()):
            raise ConfigError("this model norms each sublayer's output before the residual add (Gemma 2/3 style), "
                              "so a head's direct path is not a subtraction; direct effects are not measured")
        return named(model, "norm", "LLaMA")
