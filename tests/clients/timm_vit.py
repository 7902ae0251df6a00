"""A ViT written after timm's VisionTransformer (timm/models/vision_transformer.py, timm/layers).

Layout (as timm names it): patch_embed.{proj (Conv2d, stride = patch), norm (Identity)}, cls_token
[1, 1, D], pos_embed [1, 1 + N, D] (covers the class token: concatenate, then add), pos_drop,
patch_drop, norm_pre, blocks (nn.Sequential of Block), norm, fc_norm, head_drop, head.
Block(norm1, attn, ls1, drop_path1, norm2, mlp, ls2, drop_path2): ls* are LayerScale (gamma) when
init_values is set, else Identity. Attention(qkv, q_norm, k_norm, attn_drop, norm, proj, proj_drop)
with the `fused_attn` flag: F.scaled_dot_product_attention when set, else q * scale, softmax by hand.
timm takes fused_attn from its config (timm.layers.use_fused_attn, TIMM_FUSED_ATTN); here it is a
constructor option. LayerNorm eps 1e-6; qkv_bias True (VisionTransformer's default).
forward(x, attn_mask=None, is_causal=False): x float [B, 3, H, W] -> logits [B, num_classes],
pooled on the class token ('token'); forward_features -> [B, 1 + N, D] after `norm`.
Users save torch.save(model.state_dict(), path) and feed normalised images (see pixel_values).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

LayerNorm = partial(nn.LayerNorm, eps=1e-6)


class PatchEmbed(nn.Module):
    """2D image to patch embedding: [B, C, H, W] -> [B, N, D]."""

    def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768, bias=True):
        super().__init__()
        self.img_size, self.patch_size = (img_size, img_size), (patch_size, patch_size)
        self.grid_size = (img_size // patch_size, img_size // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.flatten = True
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, bias=bias)
        self.norm = nn.Identity()

    def forward(self, x):
        B, C, H, W = x.shape
        assert (H, W) == self.img_size, f"Input size ({H}, {W}) doesn't match model {self.img_size}."
        x = self.proj(x)  # [B, D, H/p, W/p]
        x = x.flatten(2).transpose(1, 2)  # NCHW -> NLC: [B, N, D]
        return self.norm(x)


class Attention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, qk_norm=False, proj_bias=True, attn_drop=0.0,
                 proj_drop=0.0, norm_layer=LayerNorm, fused_attn=True):
        super().__init__()
        assert dim % num_heads == 0, "dim should be divisible by num_heads"
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.attn_dim = num_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        self.fused_attn = fused_attn
        self.qkv = nn.Linear(dim, self.attn_dim * 3, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = nn.Identity()
        self.proj = nn.Linear(self.attn_dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x, attn_mask=None, is_causal=False):
        B, N, C = x.shape  # batch, tokens (1 + patches), embedding
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # [3, B, H, N, Dh]
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                               dropout_p=self.attn_drop.p if self.training else 0.0)
        else:
            q = q * self.scale
            attn = q @ k.transpose(-2, -1)  # [B, H, N, N]
            attn = attn + _mask_bias(N, attn, attn_mask, is_causal)
            attn = attn.softmax(dim=-1)
            attn = self.attn_drop(attn)
            x = attn @ v  # [B, H, N, Dh]
        x = x.transpose(1, 2).reshape(B, N, self.attn_dim)
        x = self.norm(x)
        return self.proj_drop(self.proj(x))


def _mask_bias(n: int, attn: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor | float:
    """SDPA's mask conventions as an additive bias: bool True = attend, float = added; is_causal = lower triangle."""
    if is_causal:
        attn_mask = torch.ones(n, n, dtype=torch.bool, device=attn.device).tril()
    if attn_mask is None:
        return 0.0
    if attn_mask.dtype == torch.bool:
        return torch.zeros_like(attn_mask, dtype=attn.dtype).masked_fill(~attn_mask, float("-inf"))
    return attn_mask


class LayerScale(nn.Module):
    def __init__(self, dim, init_values=1e-5):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features, act_layer=nn.GELU, bias=True, drop=0.0):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.norm = nn.Identity()
        self.fc2 = nn.Linear(hidden_features, in_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x):
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


class Block(nn.Module):
    """Transformer block with pre-normalization."""

    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=False, qk_norm=False, init_values=None,
                 proj_drop=0.0, attn_drop=0.0, norm_layer=LayerNorm, fused_attn=True):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias, qk_norm=qk_norm, attn_drop=attn_drop,
                              proj_drop=proj_drop, norm_layer=norm_layer, fused_attn=fused_attn)
        self.ls1 = LayerScale(dim, init_values=init_values) if init_values else nn.Identity()
        self.drop_path1 = nn.Identity()  # DropPath(drop_path) when drop_path > 0
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), drop=proj_drop)
        self.ls2 = LayerScale(dim, init_values=init_values) if init_values else nn.Identity()
        self.drop_path2 = nn.Identity()

    def forward(self, x, attn_mask=None, is_causal=False):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class VisionTransformer(nn.Module):
    def __init__(self, img_size=224, patch_size=16, in_chans=3, num_classes=1000, embed_dim=768, depth=12,
                 num_heads=12, mlp_ratio=4.0, qkv_bias=True, qk_norm=False, init_values=None, drop_rate=0.0,
                 pos_drop_rate=0.0, proj_drop_rate=0.0, attn_drop_rate=0.0, fused_attn=True):
        super().__init__()
        self.num_classes, self.global_pool = num_classes, "token"
        self.num_features = self.embed_dim = embed_dim
        self.num_prefix_tokens = 1
        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim)
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + self.num_prefix_tokens, embed_dim) * 0.02)
        self.pos_drop = nn.Dropout(p=pos_drop_rate)
        self.patch_drop = nn.Identity()
        self.norm_pre = nn.Identity()
        self.blocks = nn.Sequential(*[
            Block(embed_dim, num_heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_norm=qk_norm,
                  init_values=init_values, proj_drop=proj_drop_rate, attn_drop=attn_drop_rate, fused_attn=fused_attn)
            for _ in range(depth)])
        self.norm = LayerNorm(embed_dim)
        self.fc_norm = nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):  # init_weights_vit_timm: trunc normal .02, zero bias
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def _pos_embed(self, x):
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # [B, 1 + N, D]
        return self.pos_drop(x + self.pos_embed)

    def forward_features(self, x, attn_mask=None, is_causal=False):
        x = self.patch_embed(x)  # [B, N, D]
        x = self._pos_embed(x)
        x = self.norm_pre(self.patch_drop(x))
        if attn_mask is not None or is_causal:
            for blk in self.blocks:
                x = blk(x, attn_mask=attn_mask, is_causal=is_causal)
        else:
            x = self.blocks(x)
        return self.norm(x)  # [B, 1 + N, D]

    def forward_head(self, x, pre_logits: bool = False):
        x = x[:, 0]  # 'token' pooling: the class token, [B, D]
        x = self.head_drop(self.fc_norm(x))
        return x if pre_logits else self.head(x)

    def forward(self, x, attn_mask=None, is_causal=False):
        x = self.forward_features(x, attn_mask=attn_mask, is_causal=is_causal)
        return self.forward_head(x)  # [B, num_classes]


def make(seed: int = 0, *, fused_attn: bool = True, **overrides: Any) -> VisionTransformer:
    """A tiny ViT: images 3x16x16, patch 4 (16 patches + the class token), embed_dim 32, depth 2,
    4 heads, 10 classes, eval mode; overrides go to VisionTransformer (qk_norm, init_values...)."""
    torch.manual_seed(seed)
    config = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, depth=2, num_heads=4, **overrides)
    return VisionTransformer(fused_attn=fused_attn, **config).eval()
