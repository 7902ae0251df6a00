"""TransformerLens 4 TransformerBridge: `blocks.{i}.attn` is an AttentionBridge with a
`hook_pattern` HookPoint (the probabilities), a `hook_attn_scores` one (their masked pre-softmax
logits: softmax of it is the pattern) and an `o` LinearBridge (the output projection, input
[B, T, H * D]). Recognised by class, without importing transformer_lens."""

from __future__ import annotations

import torch
import torch.nn as nn

from ._hooks import gate_projection, hooks
from .base import AttentionSite, HeadOutputFn, PatternCallback, send_scores


def _is_tl(obj: object, class_name: str) -> bool:
    return any(c.__name__ == class_name and c.__module__.startswith("transformer_lens.") for c in type(obj).__mro__)


class TransformerLensAdapter:
    family = "transformer-lens"

    def find(self, model: nn.Module) -> list[AttentionSite] | None:
        blocks = getattr(model, "blocks", None) if _is_tl(model, "TransformerBridge") else None
        cfg = getattr(model, "cfg", None)
        if blocks is None or cfg is None:
            return None
        H, D = int(cfg.n_heads), int(cfg.d_head)
        Hkv = getattr(cfg, "n_key_value_heads", None)
        sites = []
        for i, block in enumerate(blocks):
            attn = getattr(block, "attn", None)
            if attn is None or not _is_tl(attn, "AttentionBridge"):
                continue
            sites.append(AttentionSite(len(sites), f"blocks.{i}.attn", H, D, attn, self,
                                       n_kv_heads=Hkv if Hkv and Hkv != H else None, out_proj=attn.o))
        return sites or None

    compile_safe = True  # watch_pattern is a forward hook on an identity module: no graph break

    def watch_pattern(self, site: AttentionSite, callback: PatternCallback):
        def hook(_m, _args, probs: torch.Tensor) -> None:
            callback(probs.detach().float())  # [B, H, Tq, Tk]

        def on_scores(_m, _args, scores: torch.Tensor) -> None:
            send_scores(callback, scores.detach())  # [B, H, Tq, Tk], masked with the dtype's minimum

        register = [lambda: site.module.hook_pattern.register_forward_hook(hook)]
        scores = getattr(site.module, "hook_attn_scores", None)
        if isinstance(scores, nn.Module):  # a bridge without it gives entropy, and `diagnose stats` says what not
            register.insert(0, lambda: scores.register_forward_hook(on_scores))
        return hooks(*register)

    def intervene(self, site: AttentionSite, fn: HeadOutputFn):
        return gate_projection(site.out_proj, site.n_heads, site.head_dim, fn)

    def blocks(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        return [(f"blocks.{i}", b) for i, b in enumerate(model.blocks)]
