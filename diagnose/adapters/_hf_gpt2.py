"""Hugging Face GPT-2 (and its cross-attention): GPT2Attention, output projection c_proj
(a Conv1D whose input is the heads side by side, [B, T, H * D])."""

from __future__ import annotations

import torch.nn as nn

from ._hf import HFAdapter
from .readout import named
from .layout import BLOCKED, HF_MIN_HEADS_NOTE, Projection, ProjectionLayout


class GPT2Adapter(HFAdapter):
    family = "hf-gpt2"
    # c_attn is a Conv1D (weight [in, out]) holding [q; k; v]; split_size follows the new width
    layout = ProjectionLayout(inputs=(Projection("c_attn", BLOCKED),), conv1d=True, heads=("num_heads",),
                              widths=("split_size",), min_heads=1, min_heads_note=HF_MIN_HEADS_NOTE)

    def site(self, name: str, m: nn.Module):
        if type(m).__name__ != "GPT2Attention":
            return None
        return m.num_heads, m.head_dim, None, m.c_proj

    def final_norm(self, model: nn.Module) -> nn.Module:
        """transformer.ln_f: GPT-2 is pre-norm, each c_proj output added to the stream (readout.py)."""
        return named(model, "ln_f", "GPT-2")
