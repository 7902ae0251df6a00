"""A 2-layer, 4-head causal LM small enough for 16k-token contexts on a CPU: attention by
F.scaled_dot_product_attention (diagnose recomputes its probabilities) or, with eager=True,
by its own softmax (the map exists and diagnose reads it). Same weights either way."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d: int, n_heads: int, eager: bool):
        super().__init__()
        self.n_heads, self.head_dim, self.eager = n_heads, d // n_heads, eager
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
                   for t in self.qkv(x).split(C, dim=2))  # [B, H, T, D]
        if self.eager:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # [B, H, T, T]
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            out = torch.softmax(scores, dim=-1) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, D]
        return self.proj(out.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, d: int, n_heads: int, eager: bool):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.attn = Attention(d, n_heads, eager)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.ln(x))


class LongLM(nn.Module):
    """Token ids [B, T] -> logits [B, T, V]; positions from a sinusoid, so any T works."""

    def __init__(self, vocab: int = 64, d: int = 32, n_heads: int = 4, n_layers: int = 2, eager: bool = False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, n_heads, eager) for _ in range(n_layers))
        self.head = nn.Linear(d, vocab)
        with torch.no_grad():  # sharper than at initialisation, so the statistics differ between heads
            for b in self.blocks:
                b.attn.qkv.weight.mul_(4.0)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids  # [B, T]
        T, d = ids.shape[1], self.emb.embedding_dim
        pos = torch.arange(T, device=ids.device, dtype=torch.float32)[:, None]
        freq = torch.exp(torch.arange(0, d, 2, device=ids.device, dtype=torch.float32) * (-math.log(1e4) / d))
        x = self.emb(ids)  # [B, T, d]
        x = x + torch.cat([(pos * freq).sin(), (pos * freq).cos()], -1).to(x.dtype)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def twin(model: LongLM) -> LongLM:
    """The same weights with eager attention."""
    other = LongLM(model.emb.num_embeddings, model.emb.embedding_dim, model.blocks[0].attn.n_heads,
                   len(model.blocks), eager=True)
    other.load_state_dict(model.state_dict())
    return other.eval()


def dispatch(model: LongLM, devices: list[str]) -> LongLM:
    """Spread the model over `devices` the way accelerate's device_map does: the embedding on the
    first, block i on devices[i % len], the head on the last, and a pre-hook per module that
    moves its input to that module's device (accelerate's AlignDevicesHook)."""
    def to_device(dev: str):
        def pre(_m, args):
            return tuple(a.to(dev) if isinstance(a, torch.Tensor) else a for a in args)
        return pre

    model.emb.to(devices[0])
    for i, b in enumerate(model.blocks):
        b.to(devices[i % len(devices)])
        b.register_forward_pre_hook(to_device(devices[i % len(devices)]))
    model.head.to(devices[-1])
    model.head.register_forward_pre_hook(to_device(devices[-1]))
    return model
