"""The hand-written nanoGPT-style model of the tests: what diagnose must handle without an
adapter (the generic probe), and whose mask and scaling can be broken on purpose.

mask_offset is the diagonal of the future mask: 1 is correct (triu(1) hides future keys),
2 lets each position see the next token, 0 also hides the token itself (the first query has
no key left and, filled with a large negative number, attends to everything), None is no mask.
scale: "sqrt" (q.k / sqrt(D)), "none" (the bug), "folded" (q * D**-0.5 before the product, as
BART does), "inverse_d" (q.k / D, muP), "sdpa" (F.scaled_dot_product_attention with a boolean
mask, default scale) or "sdpa_causal" (SDPA with is_causal=True and no mask tensor, as nanoGPT
itself does; it ignores mask_offset and padding). NanoNoMask has nanoGPT's own forward(idx).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class NanoAttention(nn.Module):
    def __init__(self, d: int, n_heads: int, mask_offset: int | None, use_padding: bool, scale: str):
        super().__init__()
        self.n_heads, self.mask_offset, self.use_padding, self.scale = n_heads, mask_offset, use_padding, scale
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def _qkv(self, x: torch.Tensor) -> list[torch.Tensor]:
        B, T, C = x.size()  # batch, sequence, embedding
        q, k, v = self.c_attn(x).split(C, dim=2)
        return [t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v)]  # (B, nh, T, hs)

    def _masked(self, T: int, pad: torch.Tensor | None) -> torch.Tensor:
        masked = torch.zeros(T, T, dtype=torch.bool)
        if self.mask_offset is not None:
            masked = torch.ones(T, T, dtype=torch.bool).triu(self.mask_offset)
        masked = masked[None, None]  # (1, 1, T, T)
        if pad is not None and self.use_padding:
            masked = masked | pad[:, None, None, :]  # (B, 1, T, T)
        return masked

    def scores(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        """The probabilities the explicit-softmax path computes, for tests to compare with.  # (B, nh, T, T)"""
        q, k, _ = self._qkv(x)
        D = k.size(-1)
        if self.scale == "folded":
            q = q * D ** -0.5
        att = q @ k.transpose(-2, -1)  # (B, nh, T, T)
        if self.scale in ("sqrt", "sdpa", "sdpa_causal"):
            att = att / math.sqrt(D)
        elif self.scale == "inverse_d":
            att = att / D
        masked = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1) if self.scale == "sdpa_causal" \
            else self._masked(x.shape[1], pad)
        return F.softmax(att.masked_fill(masked, torch.finfo(att.dtype).min), dim=-1)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self._qkv(x)
        if self.scale == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=~self._masked(T, pad))  # (B, nh, T, hs)
        elif self.scale == "sdpa_causal":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = self.scores(x, pad) @ v  # explicit softmax
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class NanoBlock(nn.Module):
    def __init__(self, d, n_heads, mask_offset, use_padding, scale):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = NanoAttention(d, n_heads, mask_offset, use_padding, scale)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, pad):
        x = x + self.attn(self.ln_1(x), pad)
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """forward(input_ids [B, T], attention_mask [B, T] | None) -> logits [B, T, V], or pooled [B, C]."""

    def __init__(self, vocab=50, d=32, n_heads=4, n_layers=2, max_len=32, mask_offset=1, use_padding=True,
                 positions=True, pooled=0, scale="sqrt"):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_len, d) if positions else None
        self.h = nn.ModuleList(NanoBlock(d, n_heads, mask_offset, use_padding, scale) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d)
        self.pooled = pooled
        self.lm_head = nn.Linear(d, pooled or vocab)

    def forward(self, input_ids, attention_mask=None):
        B, T = input_ids.shape
        x = self.wte(input_ids)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T))
        pad = None if attention_mask is None else attention_mask == 0
        for block in self.h:
            x = block(x, pad)
        x = self.ln_f(x)
        if not self.pooled:
            return self.lm_head(x)
        w = torch.ones(B, T) if attention_mask is None else attention_mask.float()
        return self.lm_head((x * w[..., None]).sum(1) / w.sum(1, keepdim=True))


class NanoNoMask(NanoGPT):
    """nanoGPT's own signature: forward(idx) only, no attention_mask argument."""

    def forward(self, idx):
        return super().forward(idx)


class TorchEncoderLM(nn.Module):
    """nn.TransformerEncoder with learned positions (fused fast path in eval); causal via a square mask."""

    def __init__(self, causal: bool = False, vocab: int = 40, d: int = 32):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(32, d)
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)
        self.causal = causal

    def forward(self, input_ids, attention_mask=None):
        T = input_ids.shape[1]
        x = self.emb(input_ids) + self.pos(torch.arange(T))
        mask = nn.Transformer.generate_square_subsequent_mask(T) if self.causal else None
        pad = None
        if attention_mask is not None:  # float like the causal mask (torch warns on mixed mask types)
            pad = torch.zeros(attention_mask.shape).masked_fill(attention_mask == 0, float("-inf"))
        return self.head(self.enc(x, mask=mask, src_key_padding_mask=pad, is_causal=self.causal))


def nanogpt(fused: bool, **kw) -> NanoNoMask:
    """nanoGPT as its users write it: forward(idx), a causal mask from explicit softmax, or
    F.scaled_dot_product_attention(is_causal=True) when fused; 2 layers of 3 heads of width 8."""
    return NanoNoMask(**{"vocab": 40, "d": 24, "n_heads": 3, "max_len": 16,
                         "scale": "sdpa_causal" if fused else "sqrt", **kw})
