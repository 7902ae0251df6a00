"""Cutting heads out of a custom attention module (nanoGPT-style, found by the generic tracer).

It needs what nanoGPT has: a fused query/key/value Linear (out = 3 * H * D, [q; k; v]) or three
Linears named like q/k/v, the output projection the tracer found, and an attribute holding the
head count (n_head, n_heads, num_heads or num_attention_heads). The module's forward must split
by n_head * head_dim, not by the embedding width (nanoGPT's `split(self.n_embd)` would not run
once heads are gone), and a layer left with no heads must not split an empty tensor (torch's
split(0) returns one piece): the verification step catches either and says so.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import ConfigError
from ._slice import head_index, keep_inputs, keep_outputs

COUNT_NAMES = ("n_head", "n_heads", "num_heads", "num_attention_heads")
_QKV_NAMES = (("q", "query", "q_proj", "q_lin"), ("k", "key", "k_proj", "k_lin"), ("v", "value", "v_proj", "v_lin"))


def cut(attn, out_proj, keep: list[int], n_heads: int, head_dim: int, fill: torch.Tensor | None) -> dict:
    width = n_heads * head_dim
    counts = [n for n in COUNT_NAMES if getattr(attn, n, None) == n_heads]
    if not counts or not isinstance(out_proj, nn.Linear):
        raise ConfigError(f"{type(attn).__name__}: cannot be cut: it needs a head-count attribute "
                          f"({', '.join(COUNT_NAMES)}) and a Linear output projection")
    linears = {n: m for n, m in attn.named_children() if isinstance(m, nn.Linear) and m is not out_proj}
    fused = [m for m in linears.values() if m.out_features == 3 * width]
    separate = [next((linears[n] for n in names if n in linears and linears[n].out_features == width), None)
                for names in _QKV_NAMES]
    if len(fused) == 1:
        keep_outputs(fused[0], torch.cat([head_index(keep, head_dim, part * width) for part in range(3)]))
    elif all(m is not None for m in separate):
        for m in separate:
            keep_outputs(m, head_index(keep, head_dim))
    else:
        raise ConfigError(f"{type(attn).__name__}: cannot be cut: no fused query/key/value Linear of "
                          f"{3 * width} outputs and no q/k/v Linears of {width} outputs")
    keep_inputs(out_proj, head_index(keep, head_dim), fold=fill)
    for name in counts:
        setattr(attn, name, len(keep))
    return {}
