"""A nanoGPT-style model whose layers may have different head counts: what a user's own model
looks like after `diagnose prune` (the factory builds it from the heads.json the prune wrote).

The attention splits its fused c_attn output by n_head * head_dim (not by the embedding width),
which is what lets heads be cut out of it.
"""

from __future__ import annotations

import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d: int, n_head: int, head_dim: int):
        super().__init__()
        self.n_head, self.head_dim = n_head, head_dim
        self.c_attn = nn.Linear(d, 3 * n_head * head_dim)
        self.c_proj = nn.Linear(n_head * head_dim, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()  # batch, sequence, embedding
        width = self.n_head * self.head_dim
        q, k, v = self.c_attn(x).split(width, dim=2) if width else [x.new_zeros(B, T, 0)] * 3  # no heads left
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, nh, T, T)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), torch.finfo(att.dtype).min)
        y = F.softmax(att, dim=-1) @ v  # (B, nh, T, hs)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, width))


class Block(nn.Module):
    def __init__(self, d: int, n_head: int, head_dim: int):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, n_head, head_dim)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoHeads(nn.Module):
    """forward(input_ids [B, T]) -> logits [B, T, V]; n_heads: one count per layer."""

    def __init__(self, n_heads=(4, 4), vocab=40, d=32, head_dim=8, max_len=16):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.h = nn.ModuleList(Block(d, n, head_dim) for n in n_heads)
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab)

    def forward(self, input_ids, attention_mask=None):  # causal; padding is scored out, not masked
        x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build() -> NanoHeads:
    """The factory: full heads, or the counts of the heads.json named by NANO_HEADS (a pruned model)."""
    path = os.environ.get("NANO_HEADS")
    if path:
        with open(path, encoding="utf-8") as f:
            return NanoHeads(json.load(f)["heads_left"])
    torch.manual_seed(0)
    return NanoHeads()
