"""The built-in reference Transformer (diagnose.zoo.model): `blocks.{i}.attn.pattern` is an
identity applied to the probabilities, `blocks.{i}.attn.scores` one applied to the masked
pre-softmax logits, `blocks.{i}.attn.proj` the output projection."""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import ConfigError
from ..zoo.model import SelfAttention, Transformer
from ._hooks import blocks_around, gate_projection, hooks
from .base import TRACED_HOOKS, AttentionSite, HeadOutputFn, PatternCallback, send_scores
from .layout import BLOCKED, Projection, ProjectionLayout
from .readout import in_layer


class ReferenceAdapter:
    family = "reference"
    # fused [q; k; v]; a layer may lose every head (its output is then exactly proj's bias), and the
    # checkpoint's config lists the heads per layer so that it rebuilds the pruned shapes
    layout = ProjectionLayout(inputs=(Projection("qkv", BLOCKED),), heads=("n_heads",), model_heads="cfg.layer_heads")

    def find(self, model: nn.Module) -> list[AttentionSite] | None:
        found = [(n, m) for n, m in model.named_modules() if isinstance(m, SelfAttention)]
        if not found:
            return None
        return [AttentionSite(i, n, m.n_heads, m.head_dim, m, self, out_proj=m.proj) for i, (n, m) in enumerate(found)]

    compile_safe = True  # watch_pattern is forward hooks on identity modules: no graph break

    def watch_pattern(self, site: AttentionSite, callback: PatternCallback):
        def hook(_module: nn.Module, _args: tuple, probs: torch.Tensor) -> None:
            callback(probs.detach().float())  # [B, H, Tq, Tk]

        def on_scores(_module: nn.Module, _args: tuple, scores: torch.Tensor) -> None:
            # the softmax's input, masked (finfo.min or -inf; 0 under the mask_fill="zero" bug), before the
            # probabilities as base.PatternCallback says: the max logit, which the probabilities cannot give
            if not TRACED_HOOKS and torch.compiler.is_compiling():
                return  # torch < 2.13's dynamo breaks the graph on the hand-over: the max logit is eager-only there
            send_scores(callback, scores.detach())  # [B, H, Tq, Tk]

        return hooks(lambda: site.module.scores.register_forward_hook(on_scores),
                     lambda: site.module.pattern.register_forward_hook(hook))

    def intervene(self, site: AttentionSite, fn: HeadOutputFn):
        return gate_projection(site.module.proj, site.n_heads, site.head_dim, fn)

    def final_norm(self, model: nn.Module) -> nn.Module:
        """ln_f, when the blocks are pre-norm with residuals (the direct path exists: readout.py)."""
        if not isinstance(model, Transformer) or model.cfg.norm != "pre" or not model.cfg.residual:
            raise ConfigError("direct effects need a pre-norm Transformer with residuals; this one is "
                              f"norm={getattr(getattr(model, 'cfg', None), 'norm', '?')!r}, residual="
                              f"{getattr(getattr(model, 'cfg', None), 'residual', '?')}, so they are not measured")
        return model.ln_f

    def mlp(self, model: nn.Module, site: AttentionSite) -> nn.Module:
        """blocks.{i}.mlp: it reads ln2 of the stream after blocks.{i}.attn wrote, and its output is added."""
        return in_layer(model, site, "mlp", "reference")

    def blocks(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        if isinstance(model, Transformer):
            return [(f"blocks.{i}", b) for i, b in enumerate(model.blocks)]
        return blocks_around(model, self.find(model) or [])
