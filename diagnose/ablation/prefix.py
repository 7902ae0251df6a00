"""Reuse of the unchanged layers below an ablated one.

Closing a head in layer l cannot change anything computed before that layer runs, so
the residual blocks that finish before site l starts can hand back what they returned
in the clean pass instead of recomputing it. `Recorder` learns, during the clean pass,
each block's output and the call order of blocks and sites; `replay` then makes those
blocks return their recorded output (repeated for K replicas) by setting the block
instance's `forward` attribute, restored in `finally`.

Safe by construction only for blocks called exactly once per forward and finished before
the site begins; anything else is never replayed. The engine also checks, once per
layer, that a clean replica run with replay reproduces the clean logits, and turns
replay off for the whole call if it does not (a block with side effects, say).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Any, Iterator, Sequence

import torch
import torch.nn as nn

from ..adapters import hooks
from ..adapters.base import AttentionSite

_MISSING = object()


def repeat_batch(obj: Any, k: int, batch: int) -> Any:
    """Repeat every tensor whose first dim is `batch` k times along it (replica-major)."""
    if k == 1:
        return obj
    if isinstance(obj, torch.Tensor):
        if obj.dim() > 0 and obj.shape[0] == batch:
            return obj.repeat(k, *([1] * (obj.dim() - 1)))
        return obj
    if isinstance(obj, dict):
        return {key: repeat_batch(v, k, batch) for key, v in obj.items()}
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(repeat_batch(v, k, batch) for v in obj)
    if isinstance(obj, list):
        return [repeat_batch(v, k, batch) for v in obj]
    return obj


def take_rows(obj: Any, start: int, stop: int, batch: int) -> Any:
    """Rows start:stop of every tensor whose first dim is `batch` (a micro-batch of a batch)."""
    if start == 0 and stop >= batch:
        return obj
    if isinstance(obj, torch.Tensor):
        return obj[start:stop] if obj.dim() > 0 and obj.shape[0] == batch else obj
    if isinstance(obj, dict):
        return {key: take_rows(v, start, stop, batch) for key, v in obj.items()}
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(take_rows(v, start, stop, batch) for v in obj)
    if isinstance(obj, list):
        return [take_rows(v, start, stop, batch) for v in obj]
    return obj


def _fresh(obj: Any, k: int, batch: int) -> Any:
    """repeat_batch, always into new tensors."""
    if k > 1:
        return repeat_batch(obj, k, batch)
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_fresh(v, k, batch) for v in obj)
    if isinstance(obj, list):
        return [_fresh(v, k, batch) for v in obj]
    if isinstance(obj, dict):
        return {key: _fresh(v, k, batch) for key, v in obj.items()}
    return obj


def _detach(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_detach(v) for v in obj)
    if isinstance(obj, list):
        return [_detach(v) for v in obj]
    return obj


class Recorder:
    """Hooks for one clean forward: block outputs, and which blocks finish before each site starts."""

    def __init__(self, blocks: Sequence[tuple[str, nn.Module]], sites: Sequence[AttentionSite]):
        self.blocks = [m for _, m in blocks]
        self.sites = list(sites)
        self.clear()

    def clear(self) -> None:
        self.outputs: dict[int, Any] = {}  # block index -> its output in the clean pass
        self.calls: dict[int, int] = {}  # block index -> number of calls
        self.done: list[int] = []  # block indices in the order they finished
        self.before: dict[int, list[int]] = {}  # site index -> blocks finished before it first started

    @contextmanager
    def recording(self) -> Iterator["Recorder"]:
        """While active, remember block outputs and call order (hooks removed on exit)."""
        self.clear()

        def block_hook(i: int):
            def hook(_m, _args, out):
                self.calls[i] = self.calls.get(i, 0) + 1
                self.outputs[i] = _detach(out)
                self.done.append(i)
            return hook

        def site_hook(j: int):
            def pre(_m, _args):
                self.before.setdefault(j, list(self.done))
            return pre

        regs = [lambda i=i, m=m: m.register_forward_hook(block_hook(i)) for i, m in enumerate(self.blocks)]
        regs += [lambda j=j, s=s: s.module.register_forward_pre_hook(site_hook(j)) for j, s in enumerate(self.sites)]
        with hooks(*regs):
            yield self

    def reusable(self, site_index: int) -> list[int]:
        """Blocks that may replay when the earliest changed site is `site_index`."""
        return [i for i in self.before.get(site_index, []) if self.calls.get(i) == 1]


@contextmanager
def replay(recorder: Recorder, outputs: dict[int, Any], block_ids: Sequence[int], k: int,
           batch: int) -> Iterator[None]:
    """Make the given blocks return their output from `outputs` (one recording), repeated for k replicas.

    Each block repeats its output when called, not up front, so that only the replicas of the
    block running now are held (the caller drops the previous block's output). A fresh copy
    even for k = 1: a model that adds into a block's output in place must not change the record.
    """
    with ExitStack() as stack:
        for i in block_ids:
            module = recorder.blocks[i]
            stack.enter_context(_forward_replaced(module, lambda *a, _o=outputs[i], **kw: _fresh(_o, k, batch)))
        yield


@contextmanager
def _forward_replaced(module: nn.Module, forward) -> Iterator[None]:
    # object.__setattr__: wrappers (TransformerLens bridges) redirect their own attribute writes
    old = module.__dict__.get("forward", _MISSING)
    object.__setattr__(module, "forward", forward)
    try:
        yield
    finally:
        if old is _MISSING:
            object.__delattr__(module, "forward")
        else:
            object.__setattr__(module, "forward", old)
