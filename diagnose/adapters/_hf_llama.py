"""Hugging Face LLaMA-style attention (LLaMA, Mistral, Qwen2, Gemma, ...): q/k/v/o_proj,
grouped-query attention (num_key_value_heads < num_attention_heads) and rotary positions
applied inside the module; output projection o_proj."""

from __future__ import annotations

import torch.nn as nn

from ._hf import HFAdapter


class LlamaAdapter(HFAdapter):
    family = "hf-llama"

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
