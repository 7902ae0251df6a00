"""Hugging Face BERT family (BERT, RoBERTa, XLM-R, ELECTRA, MiniLM, ...): the site is the
`*Attention` module holding `.self` (heads) and `.output.dense` (the output projection)."""

from __future__ import annotations

import torch.nn as nn

from ._hf import HFAdapter


class BertAdapter(HFAdapter):
    family = "hf-bert"

    def site(self, name: str, m: nn.Module):
        inner, out = getattr(m, "self", None), getattr(m, "output", None)
        if inner is None or out is None or not isinstance(getattr(out, "dense", None), nn.Linear):
            return None
        H, D = getattr(inner, "num_attention_heads", None), getattr(inner, "attention_head_size", None)
        if not (isinstance(H, int) and isinstance(D, int)):
            return None
        return H, D, None, out.dense
