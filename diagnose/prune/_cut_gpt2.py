"""Cutting heads out of Hugging Face GPT-2 attention: c_attn (a Conv1D, weight [in, out]) keeps
its q, k, v columns, c_proj its input rows; split_size follows the new width."""

from __future__ import annotations

import torch

from ._slice import head_index, keep_inputs, keep_outputs


ATTRIBUTES = ("num_heads", "split_size")  # what this cut changes (cut.ATTRIBUTES)

def cut(attn, out_proj, keep: list[int], n_heads: int, head_dim: int, fill: torch.Tensor | None) -> dict:
    width = n_heads * head_dim
    outputs = torch.cat([head_index(keep, head_dim, part * width) for part in range(3)])  # q, k, v blocks
    keep_outputs(attn.c_attn, outputs, conv1d=True)
    keep_inputs(out_proj, head_index(keep, head_dim), conv1d=True, fold=fill)
    attn.num_heads = len(keep)
    attn.split_size = len(keep) * head_dim
    return {}
