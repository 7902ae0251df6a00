"""Hugging Face GPT-2 (and its cross-attention): GPT2Attention, output projection c_proj
(a Conv1D whose input is the heads side by side, [B, T, H * D])."""

from __future__ import annotations

import torch.nn as nn

from ._hf import HFAdapter


class GPT2Adapter(HFAdapter):
    family = "hf-gpt2"

    def site(self, name: str, m: nn.Module):
        if type(m).__name__ != "GPT2Attention":
            return None
        return m.num_heads, m.head_dim, None, m.c_proj
