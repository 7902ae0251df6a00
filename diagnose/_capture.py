"""capture: every head's attention map and every block's activation statistics for one batch.

Hooks live only inside the call (removed in `finally`, also when the forward raises); the
model's outputs are exactly what they would have been without capturing.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from ._activations import STAT_NAMES, hidden_stats
from .adapters import first_tensor, hooks
from .adapters import materialise
from .adapters.base import AttentionSite
from .attention_stats import key_mask_of
from .errors import DiagnoseError, NoAttentionFoundError
from .objectives import call_model, logits_of, require_finite
from .sites import find_heads


@dataclass
class Capture:
    """attention: per site, in forward order, float32 [B, H, Tq, Tk] (per head, never averaged).
    activations: per block name, {"mean", "var", "max_abs", "token_cos"} of its output."""

    attention: list[torch.Tensor]
    activations: dict[str, dict[str, float]]
    sites: list[AttentionSite] = field(default_factory=list, repr=False)
    output: Any = field(default=None, repr=False)  # what the model returned


def capture(model: nn.Module, inputs: Any, *, attention: bool = True, activations: bool = True,
            sites: list[AttentionSite] | None = None, attention_module: str | None = None,
            n_heads: int | None = None) -> Capture:
    """Run the model once on `inputs` under no_grad and return its attention maps and per-block
    activation statistics. The inputs reach the model as diagnose.calling.call passes them: a Tensor
    positionally, a Mapping by the names its forward takes, else its main input first."""
    if sites is None:
        sites = find_heads(model, attention_module=attention_module, n_heads=n_heads, example=inputs)
    maps: list[list[torch.Tensor]] = [[] for _ in sites]
    mask = key_mask_of(inputs)
    blocks = sites[0].adapter.blocks(model) if (activations and sites) else []
    reduced: dict[str, torch.Tensor] = {}
    called = [False] * len(sites)

    def on_probs(i: int):
        def cb(probs: torch.Tensor) -> None:
            maps[i].append(materialise(probs))  # [B, H, Tq, Tk] float32: capture promises whole maps
        return cb

    def on_block(name: str):
        def hook(_m, _args, out) -> None:
            x = first_tensor(out)
            if x is not None and x.dim() >= 2 and name not in reduced:
                m = mask if mask is not None and x.dim() == 3 and tuple(mask.shape) == tuple(x.shape[:2]) else None
                reduced[name] = hidden_stats(x, m)  # [4] on the device
        return hook

    def mark(i: int):
        def pre(_m, _args) -> None:
            called[i] = True
        return pre

    with ExitStack() as stack, torch.no_grad():
        if attention:
            for i, s in enumerate(sites):
                stack.enter_context(s.adapter.watch_pattern(s, on_probs(i)))
            stack.enter_context(hooks(*[lambda s=s, i=i: s.module.register_forward_pre_hook(mark(i))
                                        for i, s in enumerate(sites)]))
        regs = [lambda m=m, n=n: m.register_forward_hook(on_block(n)) for n, m in blocks]
        stack.enter_context(hooks(*regs))
        output = call_model(model, inputs)
    try:
        logits = logits_of(output)
    except DiagnoseError:  # an output diagnose cannot read logits from: nothing to test
        logits = None
    if logits is not None:
        require_finite(model, logits.detach(), "on the captured inputs")
    acts: dict[str, dict[str, float]] = {}
    if reduced:
        # blocks may sit on different devices (a model dispatched over several): gather on the CPU
        values = torch.stack([v.float().cpu() for v in reduced.values()]).tolist()
        acts = {name: dict(zip(STAT_NAMES, v)) for name, v in zip(reduced, values)}
    silent = [s.name for s, c, m in zip(sites, called, maps) if attention and c and not m]
    if silent:  # the module ran but nothing showed its probabilities: say so rather than return nothing
        raise NoAttentionFoundError(f"attention module(s) {', '.join(silent)} ran but computed no softmax over "
                                    "[B, H, Tq, Tk] or scaled_dot_product_attention that diagnose could see; "
                                    "register an adapter for them (diagnose.register_adapter)")
    # a site that did not run in this forward (e.g. unused cross-attention) gets an empty tensor
    attn = [m[0] if m else torch.empty(0) for m in maps] if attention else []
    return Capture(attn, acts, sites, output)
