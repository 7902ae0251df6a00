"""Cutting query heads out of Hugging Face LLaMA-style attention (grouped-query attention).

Query head q reads key/value head q // n_rep. A key/value head goes only when its whole group
of query heads goes. The groups left must be the same size (transformers repeats every key/value
head n_rep times); when they are not, each surviving key/value head is repeated (its k/v rows
copied) so that every group has r = gcd(group sizes) queries: exact, at the cost of some
key/value rows.
"""

from __future__ import annotations

import math

import torch

from ._slice import head_index, keep_inputs, keep_outputs


ATTRIBUTES = ("num_key_value_groups",)  # what this cut changes (cut.ATTRIBUTES)

def cut(attn, out_proj, keep: list[int], n_heads: int, head_dim: int, fill: torch.Tensor | None) -> dict:
    n_kv = attn.k_proj.out_features // head_dim
    n_rep = n_heads // n_kv
    sizes = {}
    for q in sorted(keep):
        sizes[q // n_rep] = sizes.get(q // n_rep, 0) + 1  # kv head -> query heads kept in its group
    r = math.gcd(*sizes.values()) if sizes else 1
    kv = [g for g, n in sorted(sizes.items()) for _ in range(n // r)]  # each copy serves r queries
    keep_outputs(attn.q_proj, head_index(sorted(keep), head_dim))
    for proj in (attn.k_proj, attn.v_proj):
        keep_outputs(proj, head_index(kv, head_dim))
    keep_inputs(out_proj, head_index(sorted(keep), head_dim), fold=fill)
    attn.num_key_value_groups = r
    return {"kv_heads": len(kv), "kv_copies": len(kv) - len(sizes)}
