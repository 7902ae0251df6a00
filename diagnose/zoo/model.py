"""The reference Transformer, readable top to bottom in nanoGPT's spirit.

Shape letters, used in every comment below:
    B batch, T sequence length, C d_model, H heads, D head dim (C = H * D), V vocab.

The switches in ModelConfig reproduce the classic lessons (and the classic bugs):
attention without 1/sqrt(d_k), no positions, no residuals, Post-LN, a mask filled
with 0 instead of a large negative number.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import DataError
from .config import ModelConfig


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """Vaswani et al. (2017) position table.  # [max_len, d_model]"""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: d_model // 2])
    return table


def rotary_tables(max_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for rotary embeddings (Su et al. 2021), rotate-half layout.  # [max_len, D] each"""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.arange(max_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate q or k  # x: [B, H, T, D], cos/sin: [T, D]"""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class SelfAttention(nn.Module):
    """Multi-head self-attention with explicit softmax, so every switch is visible.

    `pattern` is an identity module applied to the attention probabilities; it exists so
    that a forward hook can read them (TransformerLens's hook_pattern idea); `scores`, likewise,
    to the masked pre-softmax logits (hook_attn_scores: the monitor's max logit). `proj` is the
    output projection; its input is the heads' outputs side by side, [B, T, H * D].
    """

    def __init__(self, cfg: ModelConfig, n_heads: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.n_heads, self.head_dim = cfg.n_heads if n_heads is None else n_heads, cfg.head_dim  # pruned: fewer heads
        with warnings.catch_warnings():  # a layer pruned to no heads has empty projections
            warnings.filterwarnings("ignore", message="Initializing zero-element tensors is a no-op")
            self.qkv = nn.Linear(cfg.d_model, 3 * self.n_heads * self.head_dim)
            self.proj = nn.Linear(self.n_heads * self.head_dim, cfg.d_model)
        self.scores, self.pattern = nn.Identity(), nn.Identity()
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self,
        x: torch.Tensor,
        key_padding: torch.Tensor | None = None,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        B, T, C = x.shape
        width = self.n_heads * self.head_dim  # C, unless heads were pruned
        q, k, v = self.qkv(x).split(width, dim=2) if width else [x.new_zeros(B, T, 0)] * 3
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        if rotary is not None:
            cos, sin = rotary
            q, k = apply_rotary(q, cos[:T], sin[:T]), apply_rotary(k, cos[:T], sin[:T])

        scores = q @ k.transpose(-2, -1)  # [B, H, T, T]
        if self.cfg.attn_scale == "sqrt":
            scores = scores / math.sqrt(self.head_dim)

        masked = torch.zeros(T, T, dtype=torch.bool, device=x.device)
        if self.cfg.is_causal:
            masked = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)  # future keys
        masked = masked[None, None]  # [1, 1, T, T]
        if key_padding is not None:
            masked = masked | key_padding[:, None, None, :]  # [B, 1, T, T]
        fill = {"large": torch.finfo(scores.dtype).min, "-inf": float("-inf"), "zero": 0.0}[self.cfg.mask_fill]
        scores = scores.masked_fill(masked, fill)

        probs = self.pattern(F.softmax(self.scores(scores), dim=-1))  # [B, H, T, T]
        out = self.drop(probs) @ v  # [B, H, T, D]
        out = out.transpose(1, 2).reshape(B, T, width)  # heads side by side: [B, T, H * D]
        return self.drop(self.proj(out))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.ff_dim)
        self.act = nn.GELU()
        self.proj = nn.Linear(cfg.ff_dim, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """One layer. Pre-LN: x + f(ln(x)). Post-LN (the 2017 original): ln(x + f(x))."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.cfg = cfg
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = SelfAttention(cfg, cfg.heads_in(layer))
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x, key_padding=None, rotary=None):
        keep = 1.0 if self.cfg.residual else 0.0  # residual off: each sublayer replaces x
        if self.cfg.norm == "pre":
            x = keep * x + self.attn(self.ln1(x), key_padding, rotary)
            x = keep * x + self.mlp(self.ln2(x))
        else:
            x = self.ln1(keep * x + self.attn(x, key_padding, rotary))
            x = self.ln2(keep * x + self.mlp(x))
        return x


class Transformer(nn.Module):
    """Decoder-only LM (logits [B, T, V]) or encoder classifier (logits [B, n_classes]).

    forward(input_ids [B, T], attention_mask [B, T] with 1 for real tokens, 0 for padding).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.positions == "learned":
            self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model)
        elif cfg.positions == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)
        elif cfg.positions == "rotary":
            cos, sin = rotary_tables(cfg.max_len, cfg.head_dim)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        # Post-LN already ends every block with a LayerNorm; Pre-LN needs a final one.
        self.ln_f = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()
        n_out = cfg.vocab_size if cfg.kind == "lm" else cfg.n_classes
        self.head = nn.Linear(cfg.d_model, n_out)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02); residual projections shrunk by 1/sqrt(2 * n_layers)."""
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln" in name or name.startswith("ln_"):
                nn.init.ones_(p)
            else:
                residual_out = name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight")
                scale = 1 / math.sqrt(2 * self.cfg.n_layers) if residual_out and self.cfg.scale_residual_init else 1.0
                if p.numel():  # a pruned layer's empty projections have nothing to draw
                    nn.init.normal_(p, mean=0.0, std=std * scale)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T = input_ids.shape
        if T > self.cfg.max_len:
            raise DataError(f"sequence length {T} exceeds max_len {self.cfg.max_len}: cut the inputs to "
                            f"{self.cfg.max_len} tokens or build the model with a larger max_len")
        x = self.tok_emb(input_ids)  # [B, T, C]
        if self.cfg.positions == "learned":
            x = x + self.pos_emb(torch.arange(T, device=input_ids.device))
        elif self.cfg.positions == "sinusoidal":
            x = x + self.pos_table[:T]
        rotary = (self.rope_cos, self.rope_sin) if self.cfg.positions == "rotary" else None
        key_padding = None if attention_mask is None else attention_mask == 0  # [B, T], True = padding
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, key_padding, rotary)
        x = self.ln_f(x)
        if self.cfg.kind == "lm":
            return self.head(x)  # [B, T, V]
        if self.cfg.pooling == "first":
            pooled = x[:, 0]
        elif attention_mask is None:
            pooled = x.mean(dim=1)
        else:
            w = attention_mask.to(x.dtype)[:, :, None]  # [B, T, 1]
            pooled = (x * w).sum(1) / w.sum(1).clamp_min(1.0)
        return self.head(pooled)  # [B, n_classes]
