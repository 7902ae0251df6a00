"""A decoder after lucidrains/x-transformers' TransformerWrapper(attn_layers=Decoder(...)), default options.

Layout (as x-transformers names it): token_emb.emb, pos_emb.emb (scaled by dim**-0.5), emb_dropout,
project_emb (Identity), attn_layers, to_logits (Linear, no bias). attn_layers.layers is a ModuleList of
ModuleLists [norms, block, residual] in layer_types order ('a', 'f', ...): norms = ModuleList([pre-branch
LayerNorm (ln + gamma, no bias), None, None]); block = Attention or FeedForward; the residual add is done
by `residual` (Residual) in AttentionLayers, which ends with final_norm. Attention(to_q, to_k, to_v,
split_*_heads, attend, merge_heads, to_out): the softmax is in `attend` (Attend), which returns
(out [B, H, T, Dh], Intermediates) before the heads are merged and projected: the output projection runs
in the parent. Attend(flash=True) calls SDPA; else it masks with -finfo.max, softmax in float32.
qk_norm: l2-normalised q and k, a fixed scale of 10 (cosine attention) instead of dim_head**-0.5.
TransformerWrapper.forward(x, return_embeddings=False, mask=None, return_attn=False, **kwargs): x [B, T]
int64, mask [B, T] bool (True = keep) -> logits [B, T, V] ([B, T, dim] with return_embeddings; with
return_attn, (logits, post-softmax attention per layer, None under flash)). Users save the state_dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Rearrange(nn.Module):  # stands in for einops' Rearrange layer (no parameters), two patterns only
    def __init__(self, pattern: str, heads: int = 0):
        super().__init__()
        self.pattern, self.heads = pattern, heads

    def forward(self, t):
        if self.pattern == "b n (h d) -> b h n d":
            return t.view(t.shape[0], t.shape[1], self.heads, -1).transpose(1, 2)
        return t.transpose(1, 2).flatten(2)  # 'b h n d -> b n (h d)'


@dataclass
class Intermediates:  # what Attend saw: [B, H, i, j] each, None under flash
    qk_similarities: torch.Tensor | None = None
    pre_softmax_attn: torch.Tensor | None = None
    post_softmax_attn: torch.Tensor | None = None


@dataclass
class LayerIntermediates:  # the residual stream entering each layer, and each attention's Intermediates
    hiddens: list = field(default_factory=list)
    attn_intermediates: list = field(default_factory=list)


class TokenEmbedding(nn.Module):
    def __init__(self, dim, num_tokens):
        super().__init__()
        self.emb = nn.Embedding(num_tokens, dim)
        nn.init.kaiming_normal_(self.emb.weight)  # x-transformers' TokenEmbedding.init_

    def forward(self, x):
        return self.emb(x.long())


class AbsolutePositionalEmbedding(nn.Module):
    def __init__(self, dim, max_seq_len):
        super().__init__()
        self.scale, self.max_seq_len = dim ** -0.5, max_seq_len
        self.emb = nn.Embedding(max_seq_len, dim)

    def forward(self, x, pos=None):
        assert x.shape[1] <= self.max_seq_len, f"sequence length {x.shape[1]} > max_seq_len {self.max_seq_len}"
        pos = torch.arange(x.shape[1], device=x.device) if pos is None else pos
        return self.emb(pos) * self.scale  # [T, dim]


class LayerNorm(nn.Module):  # bias-less: an affine-free nn.LayerNorm times a learned gamma
    def __init__(self, dim):
        super().__init__()
        self.ln = nn.LayerNorm(dim, elementwise_affine=False)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.ln(x) * self.gamma


class Residual(nn.Module):
    def prepare(self, residual):  # -> (branch input, what is added back, kwargs)
        return residual, residual, dict()

    def forward(self, x, residual, **kwargs):
        return x + residual


class FeedForward(nn.Module):
    def __init__(self, dim, mult=4, dropout=0.0):
        super().__init__()
        self.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, dim * mult), nn.GELU()), nn.Dropout(dropout),
                                nn.Linear(dim * mult, dim))  # ff.0.0, ff.0.1, ff.1, ff.2

    def forward(self, x, deep_embed=None):
        return self.ff(x)


class Attend(nn.Module):
    def __init__(self, *, causal=False, dropout=0.0, scale=None, qk_norm=False, flash=False):
        super().__init__()
        self.scale, self.causal, self.qk_norm, self.flash, self.dropout = scale, causal, qk_norm, flash, dropout
        self.attn_dropout = nn.Dropout(dropout)

    def flash_attn(self, q, k, v, mask=None):
        batch, heads, q_len, _ = q.shape
        if self.scale is not None:  # SDPA scales by its own dim**-0.5: fold the wanted scale into q
            q = q * (self.scale / q.shape[-1] ** -0.5)
        causal = self.causal and q_len > 1
        if mask is not None:
            mask = mask.expand(batch, heads, q_len, k.shape[-2])  # [B, H, i, j], True = attend
            if causal:
                mask = mask & ~torch.ones(q_len, k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
                causal = False
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                             dropout_p=self.dropout if self.training else 0.0)
        return _zero_empty_rows(out, mask), Intermediates()

    def forward(self, q, k, v, mask=None):
        """q, k, v [B, H, T, Dh]; mask bool broadcastable to [B, H, i, j], True = attend."""
        if self.flash:
            return self.flash_attn(q, k, v, mask=mask)
        scale = q.shape[-1] ** -0.5 if self.scale is None else self.scale
        sim = torch.einsum("b h i d, b h j d -> b h i j", q, k) * scale  # [B, H, i, j]
        qk_similarities = sim.clone()
        mask_value = -torch.finfo(sim.dtype).max
        if mask is not None:
            sim = sim.masked_fill(~mask, mask_value)
        i, j = sim.shape[-2:]
        if self.causal and i > 1:
            sim = sim.masked_fill(torch.ones(i, j, dtype=torch.bool, device=sim.device).triu(j - i + 1), mask_value)
        pre_softmax_attn = sim
        attn = F.softmax(sim, dim=-1) if self.qk_norm else F.softmax(sim, dim=-1, dtype=torch.float32)
        post_softmax_attn = attn = attn.type(sim.dtype)
        attn = self.attn_dropout(attn)
        out = torch.einsum("b h i j, b h j d -> b h i d", attn, v)  # [B, H, T, Dh]
        return _zero_empty_rows(out, mask), Intermediates(qk_similarities, pre_softmax_attn, post_softmax_attn)


def _zero_empty_rows(out, mask):
    """A query row with nothing to attend to gets a zero output (x-transformers' row_is_entirely_masked)."""
    return out if mask is None else out.masked_fill(~mask.any(dim=-1)[..., None], 0.0)


class Attention(nn.Module):
    def __init__(self, dim, dim_head=64, heads=8, causal=False, flash=False, dropout=0.0, qk_norm=False,
                 qk_norm_scale=10):
        super().__init__()
        self.scale, self.heads, self.causal, self.qk_norm = dim_head ** -0.5, heads, causal, qk_norm
        self.to_q = nn.Linear(dim, dim_head * heads, bias=False)
        self.to_k = nn.Linear(dim, dim_head * heads, bias=False)
        self.to_v = nn.Linear(dim, dim_head * heads, bias=False)
        self.split_q_heads = Rearrange("b n (h d) -> b h n d", heads)
        self.split_k_heads = Rearrange("b n (h d) -> b h n d", heads)
        self.split_v_heads = Rearrange("b n (h d) -> b h n d", heads)
        self.merge_heads = Rearrange("b h n d -> b n (h d)")
        self.attend = Attend(causal=causal, dropout=dropout, qk_norm=qk_norm, flash=flash,
                             scale=qk_norm_scale if qk_norm else self.scale)
        self.to_out = nn.Linear(dim_head * heads, dim, bias=False)

    def forward(self, x, mask=None, attn_mask=None, return_intermediates=False, **kwargs):
        q = self.split_q_heads(self.to_q(x))  # [B, H, T, Dh]
        k = self.split_k_heads(self.to_k(x))  # [B, H, T, Dh]
        v = self.split_v_heads(self.to_v(x))
        if self.qk_norm:
            q, k = F.normalize(q, p=2, dim=-1), F.normalize(k, p=2, dim=-1)
        masks = [] if mask is None else [~mask[:, None, None, :]]  # [B, 1, 1, S], True = hidden
        if attn_mask is not None:
            masks.append(~(attn_mask if attn_mask.ndim == 4 else attn_mask.view(1, -1, *attn_mask.shape[-2:])))
        final_attn_mask = None if not masks else ~torch.stack(torch.broadcast_tensors(*masks)).any(dim=0)
        out, intermediates = self.attend(q, k, v, mask=final_attn_mask)
        out = self.to_out(self.merge_heads(out))  # [B, T, dim]: the projection the parent applies
        if mask is not None:
            out = torch.where(mask[..., None], out, 0.0)
        return (out, intermediates) if return_intermediates else out


class AttentionLayers(nn.Module):
    def __init__(self, dim, depth, heads=8, causal=False, **kwargs):
        super().__init__()
        attn_kwargs, ff_kwargs = ({k[len(p):]: v for k, v in kwargs.items() if k.startswith(p)}
                                  for p in ("attn_", "ff_"))
        assert all(k.startswith(("attn_", "ff_")) for k in kwargs), f"options this model lacks: {kwargs}"
        self.dim, self.depth, self.causal, self.layer_types = dim, depth, causal, ("a", "f") * depth
        self.layers = nn.ModuleList([])
        for layer_type in self.layer_types:
            block = Attention(dim, heads=heads, causal=causal, **attn_kwargs) if layer_type == "a" \
                else FeedForward(dim, **ff_kwargs)
            norms = nn.ModuleList([LayerNorm(dim), None, None])  # pre-branch, post-branch, post-main
            self.layers.append(nn.ModuleList([norms, block, Residual()]))
        self.final_norm = LayerNorm(dim)

    def forward(self, x, mask=None, attn_mask=None, return_hiddens=False, **kwargs):
        intermediates = LayerIntermediates()
        for layer_type, (norm, block, residual_fn) in zip(self.layer_types, self.layers):
            x, inner_residual, residual_kwargs = residual_fn.prepare(x)
            intermediates.hiddens.append(x)
            pre_norm, _, _ = norm
            x = pre_norm(x)
            if layer_type == "a":
                out, inter = block(x, mask=mask, attn_mask=attn_mask, return_intermediates=True)
                intermediates.attn_intermediates.append(inter)
            else:
                out = block(x)
            x = residual_fn(out, inner_residual, mask=mask, **residual_kwargs)
        x = self.final_norm(x)
        return (x, intermediates) if return_hiddens else x


class Decoder(AttentionLayers):
    def __init__(self, **kwargs):
        super().__init__(causal=True, **kwargs)


class Encoder(AttentionLayers):
    def __init__(self, **kwargs):
        super().__init__(causal=False, **kwargs)


class TransformerWrapper(nn.Module):
    def __init__(self, *, num_tokens, max_seq_len, attn_layers: AttentionLayers, emb_dropout=0.0):
        super().__init__()
        dim, self.num_tokens, self.max_seq_len = attn_layers.dim, num_tokens, max_seq_len
        self.token_emb = TokenEmbedding(dim, num_tokens)
        self.pos_emb = AbsolutePositionalEmbedding(dim, max_seq_len)
        self.emb_dropout, self.project_emb = nn.Dropout(emb_dropout), nn.Identity()
        self.attn_layers = attn_layers
        self.to_logits = nn.Linear(dim, num_tokens, bias=False)

    def forward(self, x, return_embeddings=False, mask=None, return_attn=False, **kwargs):
        x = self.token_emb(x) + self.pos_emb(x)  # [B, T, dim]
        x = self.project_emb(self.emb_dropout(x))
        x, intermediates = self.attn_layers(x, mask=mask, return_hiddens=True, **kwargs)
        out = x if return_embeddings else self.to_logits(x)  # [B, T, dim] or [B, T, num_tokens]
        if return_attn:  # one [B, H, T, T] per attention layer; None each under flash
            return out, [t.post_softmax_attn for t in intermediates.attn_intermediates]
        return out


def make(seed: int = 0, *, flash: bool = False, qk_norm: bool = False, causal: bool = True, **overrides: Any):
    """TransformerWrapper(Decoder(dim=32, depth=2, heads=2, attn_dim_head=16)), vocab 64, max_seq_len 16, eval
    mode; flash/qk_norm are attn_flash/attn_qk_norm, causal=False an Encoder; overrides go to the layers."""
    torch.manual_seed(seed)
    layers = dict(dim=32, depth=2, heads=2, attn_dim_head=16, attn_flash=flash, attn_qk_norm=qk_norm, **overrides)
    return TransformerWrapper(num_tokens=64, max_seq_len=16,
                              attn_layers=(Decoder if causal else Encoder)(**layers)).eval()
