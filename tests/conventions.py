"""A hand-written decoder written in each of the conventions other people's code uses, and
with each classic wiring bug, for the convention matrix of the checks.

mask: how the causal (and padding) mask reaches the scores --
  "inf", "1e9", "1e4", "finfo"  scores.masked_fill(masked, fill) with -inf, -1e9, -1e4, finfo.min
  "where"                       torch.where(keep, scores, finfo.min) (a boolean keep-mask)
  "additive"                    scores + mask, mask 0 where kept and finfo.min where masked (HF style)
  "buffer"                      nanoGPT's registered tril `bias` buffer: masked_fill(bias == 0, -inf)
  "sdpa_bool", "sdpa_float"     F.scaled_dot_product_attention(attn_mask=bool keep-mask / additive mask)
  "sdpa_causal"                 F.scaled_dot_product_attention(is_causal=True); no padding mask possible
scale: how 1/sqrt(d_k) is applied (explicit-softmax masks only) --
  "div" s = s / sqrt(D); "idiv" s /= sqrt(D) (Falcon); "imul" s *= D**-0.5; "folded" q = q * D**-0.5
  before the product (BART); "ifolded" q *= D**-0.5 in place.
bug: None, or "unscaled" (no 1/sqrt(D)), "no_causal" (no future mask), "off_by_one" (triu(2): each
  position sees the next token), "pad_ignored" (the padding mask never reaches the scores),
  "zero_fill" (masked entries filled with 0 instead of a large negative number).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

FILLS = {"inf": float("-inf"), "1e9": -1e9, "1e4": -1e4}
EXPLICIT = ("inf", "1e9", "1e4", "finfo", "where", "additive", "buffer")
SDPA = ("sdpa_bool", "sdpa_float", "sdpa_causal")
SCALES = ("div", "idiv", "imul", "folded", "ifolded")


class ConvAttention(nn.Module):
    def __init__(self, d: int, n_heads: int, mask: str, scale: str, bug: str | None, max_len: int):
        super().__init__()
        self.n_heads, self.mask, self.scale, self.bug = n_heads, mask, scale, bug
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        if mask == "buffer":
            self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len))

    def _keep(self, T: int, pad: torch.Tensor | None) -> torch.Tensor:
        """True where a query may read a key.  # (B or 1, 1, T, T) bool"""
        diagonal = {"no_causal": T, "off_by_one": 1}.get(self.bug, 0)
        keep = torch.ones(T, T, dtype=torch.bool).tril(diagonal)[None, None]
        if pad is not None and self.bug != "pad_ignored":
            keep = keep & ~pad[:, None, None, :]
        return keep

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None) -> torch.Tensor:
        B, T, C = x.size()  # batch, sequence, embedding
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
                   for t in self.c_attn(x).split(C, dim=2))  # (B, nh, T, hs)
        D = k.size(-1)
        if self.mask in SDPA:
            y = self._sdpa(q, k, v, pad)
        else:
            y = F.softmax(self._scores(q, k, pad), dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

    def _sdpa(self, q, k, v, pad):
        scale = 1.0 if self.bug == "unscaled" else None
        if self.mask == "sdpa_causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.bug != "no_causal", scale=scale)
        keep = self._keep(q.shape[-2], pad)
        if self.mask == "sdpa_bool":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale)
        fill = 0.0 if self.bug == "zero_fill" else torch.finfo(q.dtype).min
        add = torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, fill)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=add, scale=scale)

    def _scores(self, q, k, pad):
        D = k.size(-1)
        scaled = self.bug != "unscaled"
        if scaled and self.scale == "folded":
            q = q * D ** -0.5
        elif scaled and self.scale == "ifolded":
            q = q.clone()
            q *= D ** -0.5
        s = q @ k.transpose(-2, -1)  # (B, nh, T, T)
        if scaled and self.scale == "div":
            s = s / math.sqrt(D)
        elif scaled and self.scale == "idiv":
            s /= math.sqrt(D)
        elif scaled and self.scale == "imul":
            s *= D ** -0.5
        T = s.shape[-1]
        keep = self._keep(T, pad)
        fill = 0.0 if self.bug == "zero_fill" else FILLS.get(self.mask, torch.finfo(s.dtype).min)
        if self.mask == "buffer":
            causal = self.bias[:, :, :T, :T] == 0 if self.bug is None or self.bug != "no_causal" \
                else torch.zeros(1, 1, T, T, dtype=torch.bool)
            if self.bug == "off_by_one":
                causal = ~keep[:1]
            fill = 0.0 if self.bug == "zero_fill" else float("-inf")
            s = s.masked_fill(causal, fill)
            if pad is not None and self.bug != "pad_ignored":
                s = s.masked_fill(pad[:, None, None, :], fill)
            return s
        if self.mask == "where":
            return torch.where(keep, s, torch.tensor(fill, dtype=s.dtype))
        if self.mask == "additive":
            return s + torch.zeros(keep.shape, dtype=s.dtype).masked_fill(~keep, fill)
        return s.masked_fill(~keep, fill)


class ConvBlock(nn.Module):
    def __init__(self, d, n_heads, mask, scale, bug, max_len):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = ConvAttention(d, n_heads, mask, scale, bug, max_len)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, pad):
        x = x + self.attn(self.ln_1(x), pad)
        return x + self.mlp(self.ln_2(x))


class ConvLM(nn.Module):
    """forward(input_ids [B, T], attention_mask [B, T] | None) -> logits [B, T, V]."""

    def __init__(self, mask: str = "inf", scale: str = "div", bug: str | None = None,
                 vocab: int = 40, d: int = 32, n_heads: int = 2, n_layers: int = 2, max_len: int = 32):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.h = nn.ModuleList(ConvBlock(d, n_heads, mask, scale, bug, max_len) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab)

    def forward(self, input_ids, attention_mask=None):
        x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.shape[1]))
        pad = None if attention_mask is None else attention_mask == 0
        for block in self.h:
            x = block(x, pad)
        return self.lm_head(self.ln_f(x))


class ConvLMIds(ConvLM):
    """nanoGPT's signature, forward(idx): for SDPA with is_causal, which takes no padding mask."""

    def forward(self, idx):
        return super().forward(idx)


def conv_lm(mask: str = "inf", scale: str = "div", bug: str | None = None, **kw) -> ConvLM:
    return (ConvLMIds if mask == "sdpa_causal" else ConvLM)(mask, scale, bug, **kw)
