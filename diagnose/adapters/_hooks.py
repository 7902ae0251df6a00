"""Hook plumbing shared by the adapters: every hook lives in a context manager and is
removed in `finally`, so a forward that raises never leaves one behind."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from .base import AttentionSite, HeadOutputFn, PatternCallback, hand_over


@contextmanager
def hooks(*register: Callable[[], RemovableHandle]) -> Iterator[None]:
    """Call each registration, yield, and remove every handle made, whatever happens."""
    handles: list[RemovableHandle] = []
    try:
        for reg in register:
            handles.append(reg())
        yield
    finally:
        for h in handles:
            h.remove()


def gate_projection(proj: nn.Module, n_heads: int, head_dim: int, fn: HeadOutputFn):
    """Context manager: a pre-hook on the output projection applies fn to its input seen as heads.

    The projection's input is the heads' outputs side by side, [..., T, H * D]; fn sees and
    returns [B, T, H, D] (a 2-D input [T, H * D] is seen as B = 1).
    """

    def pre(_module: nn.Module, args: tuple):
        x = args[0]  # [B, T, H * D]
        assert x.shape[-1] == n_heads * head_dim, f"projection input {tuple(x.shape)} is not H * D = {n_heads} * {head_dim}"
        B = x.shape[0] if x.dim() >= 3 else 1
        heads = x.reshape(B, -1, n_heads, head_dim)  # [B, T, H, D]
        out = fn(heads)  # [B, T, H, D]
        return (out.reshape(x.shape),) + tuple(args[1:])

    return hooks(lambda: proj.register_forward_pre_hook(pre))


def first_tensor(output) -> torch.Tensor | None:
    """The tensor a module returned: itself, or the first element of a tuple/list."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def blocks_around(model: nn.Module, sites: list[AttentionSite]) -> list[tuple[str, nn.Module]]:
    """The residual blocks: the ModuleList/Sequential items that contain the attention sites.

    A site's block is its closest ancestor that is a direct child of a ModuleList or
    Sequential; without one (a lone attention module) the site module itself stands in.
    """
    parents = {name: m for name, m in model.named_modules()}
    out: list[tuple[str, nn.Module]] = []
    seen: set[str] = set()
    for site in sites:
        parts = site.name.split(".")
        chosen = site.name
        for i in range(len(parts), 0, -1):
            container = parents.get(".".join(parts[: i - 1]) if i > 1 else "")
            if isinstance(container, (nn.ModuleList, nn.Sequential)) and parts[i - 1].isdigit():
                chosen = ".".join(parts[:i])
                break
        if chosen not in seen:
            seen.add(chosen)
            out.append((chosen, parents[chosen]))
    return out


def watch_q_k(module: nn.Module, q_src: nn.Module, k_src: nn.Module, head_dim: int, arguments: dict[str, int],
              probs_of: Callable, eager: bool, callback: PatternCallback):
    """Context manager: attention probabilities rebuilt from plain module hooks, which dynamo traces into a
    compiled graph. A pre-hook on `module` keeps its `arguments` (keyword name: position when passed
    positionally); forward hooks on q_src and k_src (in that order in the forward) give q and k, each seen
    as heads [B, H, T, D]; probs_of(q, k, kept) builds the LazyProbs, a 4-D `attention_mask` cut to the keys
    first (eager_attention_forward's own cut), and hand_over gives it to callback as the intercept would.
    Forwards without grad (evaluation, a cache's decoding) are not read."""
    seen: dict[str, Any] = {}

    def heads(x: torch.Tensor) -> torch.Tensor:  # [B, T, H * D] or [B, T, H, D] -> [B, H, T, D]
        return x.reshape(x.shape[0], x.shape[1], -1, head_dim).transpose(1, 2)

    def pre(_m, args: tuple, kwargs: dict) -> None:
        for name, pos in arguments.items():
            seen[name] = kwargs.get(name, args[pos] if len(args) > pos else None)

    def on_q(_m, _args, out: torch.Tensor) -> None:
        seen["q"] = out

    def on_k(_m, _args, out: torch.Tensor) -> None:
        q, kept = seen.pop("q", None), {name: seen.pop(name, None) for name in arguments}
        if q is None or not torch.is_grad_enabled():
            return
        mask = kept.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 4:
            kept["attention_mask"] = mask[..., :out.shape[1]]
        probs = probs_of(heads(q), heads(out), kept)
        if probs is not None:
            hand_over(callback, probs, eager)

    return hooks(lambda: module.register_forward_pre_hook(pre, with_kwargs=True),
                 lambda: q_src.register_forward_hook(on_q), lambda: k_src.register_forward_hook(on_k))
