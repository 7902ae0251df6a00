"""Cutting heads out of Hugging Face BERT-family attention: query/key/value rows, output.dense columns."""

from __future__ import annotations

import torch

from ._slice import head_index, keep_inputs, keep_outputs


ATTRIBUTES = ("num_attention_heads", "all_head_size")  # what this cut changes (cut.ATTRIBUTES)

def cut(attn, out_proj, keep: list[int], n_heads: int, head_dim: int, fill: torch.Tensor | None) -> dict:
    index = head_index(keep, head_dim)
    inner = attn.self
    for proj in (inner.query, inner.key, inner.value):
        keep_outputs(proj, index)
    keep_inputs(out_proj, index, fold=fill)
    inner.num_attention_heads = len(keep)
    inner.all_head_size = len(keep) * head_dim
    return {}
