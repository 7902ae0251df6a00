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


_LISTS = (nn.ModuleList, nn.Sequential)


def _items_holding(modules: dict[str, nn.Module], name: str) -> list[tuple[str, str]]:
    """(container, item) for each ancestor of `name` (itself included) that is an item of a
    ModuleList/Sequential, whatever the item is called ('3', 'encoder_layer_3'), innermost first."""
    parts = name.split(".") if name else []
    out = []
    for i in range(len(parts), 0, -1):
        container = ".".join(parts[:i - 1])
        if isinstance(modules.get(container), _LISTS):
            out.append((container, ".".join(parts[:i])))
    return out


def _stand_in(modules: dict[str, nn.Module], item: str, finished: dict[str, int] | None) -> nn.Module:
    """The module whose output is the stream after block `item`: the item itself, or, for an item the
    forward never calls (x-transformers' ModuleList([norms, block, residual]) that the parent's loop
    unpacks), the module inside it that finished last in the traced forward (the residual add, or
    a post-norm after it)."""
    mod = modules[item]
    called = not isinstance(mod, (nn.ModuleList, nn.ModuleDict)) and (finished is None or item in finished)
    if called or not finished:
        return mod
    inside = [(i, n) for n, i in finished.items() if n.startswith(item + ".")]
    return modules[max(inside)[1]] if inside else mod


def blocks_around(model: nn.Module, sites: list[AttentionSite],
                  finished: dict[str, int] | None = None) -> list[tuple[str, nn.Module]]:
    """The residual blocks: the items of the ModuleList/Sequential that holds the attention sites one
    per item, as (item name, the module whose output is the residual stream after it).

    Of a site's ancestors that are list items, the one whose list holds the most site-holding items
    is its block (ties: the outer one), so that nested lists (x-transformers' `layers[i]` =
    ModuleList([norms, attention, residual])) and a stack wrapped in a Sequential both give the
    per-layer items. The list's other items of the same class (x-transformers' feed-forward layers)
    are blocks too. `finished` (module name -> the order its forward ended in a traced forward)
    picks the module standing in for an item that is never called (_stand_in). Without a list
    around it, a site's own module stands in (a lone attention module).
    """
    modules = dict(model.named_modules())
    per_site = [_items_holding(modules, s.name.split("#")[0]) for s in sites]
    holding: dict[str, set[str]] = {}
    for cands in per_site:
        for container, item in cands:
            holding.setdefault(container, set()).add(item)
    chosen: dict[str, set[str]] = {}  # container -> its site-holding items, in first-site order of containers
    lone: list[str] = []
    for s, cands in zip(sites, per_site):
        best = None
        for container, item in cands:  # innermost first: >= lets the outer one win a tie
            if best is None or len(holding[container]) >= len(holding[best[0]]):
                best = (container, item)
        if best is None:
            lone.append(s.name.split("#")[0])
        else:
            chosen.setdefault(best[0], set()).add(best[1])
    out: list[tuple[str, nn.Module]] = []
    for container, items in chosen.items():
        kinds = {type(modules[i]) for i in items}
        prefix = f"{container}." if container else ""
        for key, mod in modules[container].named_children():
            name = prefix + key
            if name in items or type(mod) in kinds:
                out.append((name, _stand_in(modules, name, finished)))
    for name in lone:
        if all(name != n for n, _ in out):
            out.append((name, modules[name]))
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
