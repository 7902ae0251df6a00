"""Configuration of the reference Transformer: every switch the classic lessons talk about."""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..errors import ConfigError

_CHOICES = {
    "kind": ("lm", "classifier"),
    "norm": ("pre", "post"),
    "positions": ("sinusoidal", "learned", "rotary", "none"),
    "attn_scale": ("sqrt", "none"),
    "mask_fill": ("large", "-inf", "zero"),
    "pooling": ("mean", "first"),
}


@dataclass
class ModelConfig:
    """Shape and switches of the reference model.

    kind: "lm" (decoder-only, causal, next-token logits [B, T, V]) or "classifier"
    (bidirectional encoder, pooled logits [B, n_classes]).
    mask_fill: what masked attention scores are filled with before softmax. "zero" is the
    classic bug: exp(0) is not 0, so masked positions still receive weight.
    """

    kind: str = "lm"
    vocab_size: int = 32
    n_classes: int = 2
    max_len: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 64
    d_ff: int = 0  # 0 means 4 * d_model
    norm: str = "pre"
    positions: str = "learned"
    attn_scale: str = "sqrt"
    residual: bool = True
    mask_fill: str = "large"
    causal: bool | None = None  # None: causal for "lm", bidirectional for "classifier"
    pooling: str = "mean"
    init_std: float = 0.02
    scale_residual_init: bool = True  # residual output projections get std / sqrt(2 * n_layers)
    dropout: float = 0.0
    pad_id: int = 0
    # heads per layer after pruning (diagnose prune); None: n_heads in every layer. The head dim
    # stays d_model // n_heads, so a layer with h heads has an attention width of h * head_dim.
    layer_heads: list[int] | None = None

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            if not isinstance(getattr(self, name), str) or getattr(self, name) not in allowed:
                raise ConfigError(f"{name}={getattr(self, name)!r} is not one of {', '.join(allowed)}")
        for name in ("vocab_size", "max_len", "n_layers", "n_heads", "d_model", "n_classes", "d_ff", "pad_id"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                raise ConfigError(f"{name} must be an integer, got {value!r}")
            least = 0 if name in ("d_ff", "pad_id") else 1
            if value < least:
                raise ConfigError(f"{name} must be at least {least}, got {value}")
        for name in ("init_std", "dropout"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
                raise ConfigError(f"{name} must be a finite number, got {value!r}")
        for name in ("residual", "scale_residual_init"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.causal is not None and not isinstance(self.causal, bool):
            raise ConfigError(f"causal must be true, false or null, got {self.causal!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.layer_heads is not None:
            heads = self.layer_heads
            if not isinstance(heads, (list, tuple)) or len(heads) != self.n_layers or not all(
                    isinstance(h, numbers.Integral) and not isinstance(h, bool) and 0 <= h <= self.n_heads
                    for h in heads):
                raise ConfigError(f"layer_heads must list {self.n_layers} head counts from 0 to {self.n_heads}, "
                                  f"got {heads!r}")
            self.layer_heads = [int(h) for h in heads]
        if self.positions == "rotary" and self.head_dim % 2:
            raise ConfigError(f"rotary positions need an even head dim, got {self.head_dim}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def heads_in(self, layer: int) -> int:
        """Heads of layer `layer` (n_heads unless pruned)."""
        return self.n_heads if self.layer_heads is None else self.layer_heads[layer]

    @property
    def ff_dim(self) -> int:
        return self.d_ff or 4 * self.d_model

    @property
    def is_causal(self) -> bool:
        return self.kind == "lm" if self.causal is None else bool(self.causal)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        if not isinstance(data, dict):
            raise ConfigError(f"a model config is a dict of settings, not a {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(map(str, set(data) - known))
        if unknown:
            raise ConfigError(f"unknown model config keys: {', '.join(unknown)}")
        return cls(**data)
