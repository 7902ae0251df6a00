"""Hugging Face GPT-2 (and its cross-attention): GPT2Attention, output projection c_proj
(a Conv1D whose input is the heads side by side, [B, T, H * D])."""

from __future__ import annotations

import torch
import torch.nn as nn

from ._hf import HFAdapter
from ._hooks import hooks
from ._probs import LazyProbs
from .base import AttentionSite, PatternCallback, hand_over
from .layout import BLOCKED, HF_MIN_HEADS_NOTE, Projection, ProjectionLayout
from .readout import in_layer, named


class GPT2Adapter(HFAdapter):
    family = "hf-gpt2"
    # c_attn is a Conv1D (weight [in, out]) holding [q; k; v]; split_size follows the new width
    layout = ProjectionLayout(inputs=(Projection("c_attn", BLOCKED),), conv1d=True, heads=("num_heads",),
                              widths=("split_size",), min_heads=1, min_heads_note=HF_MIN_HEADS_NOTE)
    compile_safe = True  # under torch.compile the monitor watches through watch_pattern_traced: module hooks

    def site(self, name: str, m: nn.Module):
        if type(m).__name__ != "GPT2Attention":
            return None
        return m.num_heads, m.head_dim, None, m.c_proj

    def watch_pattern_traced(self, site: AttentionSite, callback: PatternCallback):
        """As watch_pattern, with plain module hooks that dynamo traces into a graph (the intercept's
        torch function mode, entered in a pre-hook, breaks it): q and k are read from the outputs
        of c_attn (and q_attn, cross-attention), the mask from the module's keywords, and the
        probabilities recomputed from them as for SDPA (LazyProbs). The callback gets what the
        intercept would give: the whole map under the eager implementation (a model's own
        softmax), a LazyProbs otherwise. Past keys of a cache are not seen: sampling reads
        training forwards (grad enabled), which carry none."""
        m = site.module
        H, D = site.n_heads, site.head_dim
        cross = bool(getattr(m, "is_cross_attention", False))
        seen: dict[str, torch.Tensor | None] = {}

        def heads(x: torch.Tensor) -> torch.Tensor:  # [B, T, H * D] -> [B, H, T, D]
            return x.reshape(*x.shape[:-1], H, D).transpose(1, 2)

        def pre(_m, args: tuple, kwargs: dict) -> None:
            key = "encoder_attention_mask" if cross else "attention_mask"
            pos = 5 if cross else 2  # GPT2Attention.forward's position of the mask, for callers passing it so
            seen["mask"] = kwargs.get(key, args[pos] if len(args) > pos else None)

        def on_q(_m, _args, out: torch.Tensor) -> None:
            seen["q"] = out  # [B, Tq, H * D]

        def on_qkv(_m, _args, out: torch.Tensor) -> None:
            parts = out.split(H * D, dim=-1)  # self: [q; k; v], cross: [k; v], each [B, T, H * D]
            q, k = (seen.pop("q", None), parts[0]) if cross else (parts[0], parts[1])
            if q is None or not torch.is_grad_enabled():
                return
            mask = seen.pop("mask", None)  # additive, [B or 1, 1, Tq, Tk], or None
            probs = LazyProbs(heads(q), heads(k), mask, is_causal=not cross, scale=_scaling(m, D))  # [B, H, Tq, Tk]
            hand_over(callback, probs, eager=m.config._attn_implementation == "eager")

        register = [lambda: m.register_forward_pre_hook(pre, with_kwargs=True),
                    lambda: m.c_attn.register_forward_hook(on_qkv)]
        if cross:
            register.append(lambda: m.q_attn.register_forward_hook(on_q))
        return hooks(*register)


    def final_norm(self, model: nn.Module) -> nn.Module:
        """transformer.ln_f: GPT-2 is pre-norm, each c_proj output added to the stream (readout.py)."""
        return named(model, "ln_f", "GPT-2")

    def mlp(self, model: nn.Module, site: AttentionSite) -> nn.Module:
        """h.{i}.mlp (GPT2MLP): it reads ln_2 of the stream after h.{i}.attn wrote; its output is added."""
        return in_layer(model, site, "mlp", "GPT-2")


def _scaling(m: nn.Module, head_dim: int) -> float:
    """The attention scale GPT2Attention uses (transformers >= 4.48 keeps it as `scaling`)."""
    if hasattr(m, "scaling"):
        return float(m.scaling)
    scale = head_dim ** -0.5 if m.scale_attn_weights else 1.0
    return scale / float(m.layer_idx + 1) if m.scale_attn_by_inverse_layer_idx else scale
