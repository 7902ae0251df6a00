"""Hook plumbing shared by the adapters: every hook lives in a context manager and is
removed in `finally`, so a forward that raises never leaves one behind."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from .base import AttentionSite, HeadOutputFn


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
