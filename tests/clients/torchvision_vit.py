"""A ViT written after torchvision's VisionTransformer (torchvision/models/vision_transformer.py).

Layout (as torchvision names it): conv_proj (Conv2d, stride = patch), class_token [1, 1, D],
encoder.{pos_embedding [1, 1 + N, D], dropout, layers (nn.Sequential of encoder_layer_{i}), ln},
heads.head (nn.Sequential holding one Linear). EncoderBlock(ln_1, self_attention, dropout, ln_2, mlp):
self_attention is nn.MultiheadAttention(batch_first=True) called with need_weights=False (so in eval
mode under no_grad torch takes its fused fast path and no attention weights exist), and the block
returns x + mlp(ln_2(x)) with x = attention + input: the block, not the attention module, is the
residual unit. MLPBlock is an nn.Sequential: 0 Linear, 1 GELU, 2 Dropout, 3 Linear, 4 Dropout.
LayerNorm eps 1e-6. forward(x): float [B, 3, H, W] (H = W = image_size) -> logits [B, num_classes]
from the class token. torchvision zero-initialises heads.head (logits all 0 before training); make()
gives it small random weights, as training would, so that outputs depend on the input.
Users save torch.save(model.state_dict(), path) and feed normalised images (see pixel_values).
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
from typing import Any

import torch
import torch.nn as nn

LayerNorm = partial(nn.LayerNorm, eps=1e-6)


class MLPBlock(nn.Sequential):
    """Transformer MLP block (torchvision.ops.MLP: Linear, GELU, Dropout, Linear, Dropout)."""

    _version = 2

    def __init__(self, in_dim: int, mlp_dim: int, dropout: float):
        super().__init__(nn.Linear(in_dim, mlp_dim), nn.GELU(), nn.Dropout(dropout),
                         nn.Linear(mlp_dim, in_dim), nn.Dropout(dropout))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.normal_(m.bias, std=1e-6)


class EncoderBlock(nn.Module):
    """Transformer encoder block."""

    def __init__(self, num_heads, hidden_dim, mlp_dim, dropout, attention_dropout, norm_layer=LayerNorm):
        super().__init__()
        self.num_heads = num_heads
        self.ln_1 = norm_layer(hidden_dim)
        self.self_attention = nn.MultiheadAttention(hidden_dim, num_heads, dropout=attention_dropout, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = norm_layer(hidden_dim)
        self.mlp = MLPBlock(hidden_dim, mlp_dim, dropout)

    def forward(self, input: torch.Tensor):
        torch._assert(input.dim() == 3, f"Expected (batch_size, seq_length, hidden_dim) got {input.shape}")
        x = self.ln_1(input)
        x, _ = self.self_attention(query=x, key=x, value=x, need_weights=False)  # [B, S, D], no weights
        x = self.dropout(x)
        x = x + input
        y = self.ln_2(x)
        y = self.mlp(y)
        return x + y


class Encoder(nn.Module):
    """Transformer Model Encoder for sequence to sequence translation."""

    def __init__(self, seq_length, num_layers, num_heads, hidden_dim, mlp_dim, dropout, attention_dropout,
                 norm_layer=LayerNorm):
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, seq_length, hidden_dim).normal_(std=0.02))  # from BERT
        self.dropout = nn.Dropout(dropout)
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        for i in range(num_layers):
            layers[f"encoder_layer_{i}"] = EncoderBlock(num_heads, hidden_dim, mlp_dim, dropout, attention_dropout,
                                                        norm_layer)
        self.layers = nn.Sequential(layers)
        self.ln = norm_layer(hidden_dim)

    def forward(self, input: torch.Tensor):
        torch._assert(input.dim() == 3, f"Expected (batch_size, seq_length, hidden_dim) got {input.shape}")
        input = input + self.pos_embedding
        return self.ln(self.layers(self.dropout(input)))


class VisionTransformer(nn.Module):
    """Vision Transformer as per https://arxiv.org/abs/2010.11929 (no conv stem, no representation layer)."""

    def __init__(self, image_size, patch_size, num_layers, num_heads, hidden_dim, mlp_dim, dropout=0.0,
                 attention_dropout=0.0, num_classes=1000, norm_layer=LayerNorm):
        super().__init__()
        torch._assert(image_size % patch_size == 0, "Input shape indivisible by patch size!")
        self.image_size, self.patch_size, self.hidden_dim, self.mlp_dim = image_size, patch_size, hidden_dim, mlp_dim
        self.num_classes = num_classes
        self.conv_proj = nn.Conv2d(in_channels=3, out_channels=hidden_dim, kernel_size=patch_size, stride=patch_size)
        seq_length = (image_size // patch_size) ** 2 + 1  # patches and the class token
        self.class_token = nn.Parameter(torch.zeros(1, 1, hidden_dim))
        self.encoder = Encoder(seq_length, num_layers, num_heads, hidden_dim, mlp_dim, dropout, attention_dropout,
                               norm_layer)
        self.seq_length = seq_length
        self.heads = nn.Sequential(OrderedDict(head=nn.Linear(hidden_dim, num_classes)))
        fan_in = self.conv_proj.in_channels * self.conv_proj.kernel_size[0] * self.conv_proj.kernel_size[1]
        nn.init.trunc_normal_(self.conv_proj.weight, std=(1 / fan_in) ** 0.5)
        nn.init.zeros_(self.conv_proj.bias)
        nn.init.zeros_(self.heads.head.weight)
        nn.init.zeros_(self.heads.head.bias)

    def _process_input(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        p = self.patch_size
        torch._assert(h == self.image_size, f"Wrong image height! Expected {self.image_size} but got {h}!")
        torch._assert(w == self.image_size, f"Wrong image width! Expected {self.image_size} but got {w}!")
        x = self.conv_proj(x)  # (n, hidden_dim, n_h, n_w)
        x = x.reshape(n, self.hidden_dim, (h // p) * (w // p))  # (n, hidden_dim, n_h * n_w)
        return x.permute(0, 2, 1)  # (n, n_h * n_w, hidden_dim)

    def forward(self, x: torch.Tensor):
        x = self._process_input(x)
        n = x.shape[0]
        batch_class_token = self.class_token.expand(n, -1, -1)
        x = torch.cat([batch_class_token, x], dim=1)  # (n, 1 + n_h * n_w, hidden_dim)
        x = self.encoder(x)
        x = x[:, 0]  # the class token, as language models' [CLS]
        return self.heads(x)  # (n, num_classes)


def make(seed: int = 0, **overrides: Any) -> VisionTransformer:
    """A tiny ViT: images 3x16x16, patch 4 (16 patches + the class token), hidden_dim 32, mlp_dim 64,
    2 layers, 4 heads, 10 classes, eval mode, heads.head re-initialised N(0, 0.02) (see the module
    docstring); overrides go to VisionTransformer."""
    torch.manual_seed(seed)
    config = dict(image_size=16, patch_size=4, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=10)
    model = VisionTransformer(**{**config, **overrides})
    nn.init.normal_(model.heads.head.weight, std=0.02)
    return model.eval()
