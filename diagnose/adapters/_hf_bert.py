"""Hugging Face BERT family (BERT, RoBERTa, XLM-R, ELECTRA, MiniLM, ...): the site is the
`*Attention` module holding `.self` (heads) and `.output.dense` (the output projection)."""

from __future__ import annotations

import torch.nn as nn

from ._hf import HFAdapter
from ..errors import ConfigError
from .layout import HF_MIN_HEADS_NOTE, Projection, ProjectionLayout


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

    def final_norm(self, model: nn.Module) -> nn.Module:
        """None exists: BERT is post-norm, so every later layer's LayerNorm sits on a head's path (readout.py)."""
        raise ConfigError("BERT-family models are post-norm (each layer's LayerNorm sits on the path from a head "
                          "to the output), so direct effects are not measured")
