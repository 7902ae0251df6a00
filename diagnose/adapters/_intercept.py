"""Attention probabilities from inside any forward: a TorchFunctionMode, active only while an
attention module runs, sees every softmax over the last dim of a 4-D tensor (eager code) and
every F.scaled_dot_product_attention call (fused code, whose probabilities never exist), for
which it recomputes softmax(q k^T * scale + mask) from the very same q, k, mask and scale,
lazily, by query rows (see _probs.py): nothing of size [B, H, Tq, Tk] is made unless asked.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ._hooks import hooks
from ._probs import LazyProbs, Probs

SDPA = F.scaled_dot_product_attention
SOFTMAX = {torch.softmax, F.softmax, torch.Tensor.softmax, torch.special.softmax}
# on_call(kind, probs, q) with kind "softmax" or "sdpa"; probs [B, H, Tq, Tk]: the model's own softmax output
# (a Tensor, its dtype) or, for sdpa, a LazyProbs that recomputes rows on demand; q [B, H, Tq, D] for sdpa
OnCall = Callable[[str, Probs, "torch.Tensor | None"], None]


def _sdpa_args(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return query, key, attn_mask, is_causal, scale


def sdpa_probs(query, key, attn_mask=None, is_causal=False, scale=None) -> torch.Tensor:
    """The probabilities SDPA uses but never returns, all at once (see LazyProbs).  # [B, H, Tq, Tk] float32"""
    return LazyProbs(query, key, attn_mask, is_causal, scale).full()


def _is_attention_softmax(func, args, kwargs, out) -> bool:
    if func not in SOFTMAX or not isinstance(out, torch.Tensor) or out.dim() != 4:
        return False
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    return dim is not None and dim % 4 == 3


_BUSY = [0]  # > 0 while an AttentionMode does its own work: nested modes must not see that as the model's


class AttentionMode(TorchFunctionMode):
    """Calls on_call for each attention softmax / SDPA while it is on the mode stack.

    Several modes may nest (one per watcher of a module); each sees the model's own calls, none
    sees the softmax another one computes to recompute SDPA's probabilities, nor its callback's.
    """

    def __init__(self, on_call: OnCall, on_scores: Callable[[torch.Tensor], None] | None = None):
        super().__init__()
        self.on_call = on_call
        self.on_scores = on_scores  # given the softmax's input (the logits) of a model's own softmax

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)  # the model's own result, untouched
        if _BUSY[0]:
            return out
        _BUSY[0] += 1
        try:
            if func is SDPA:
                q, k, mask, causal, scale = _sdpa_args(*args, **kwargs)
                self.on_call("sdpa", LazyProbs(q, k, mask, causal, scale), q)
            elif _is_attention_softmax(func, args, kwargs, out):
                if self.on_scores is not None:
                    self.on_scores((args[0] if args else kwargs["input"]).detach())  # [B, H, Tq, Tk] logits
                self.on_call("softmax", out.detach(), None)  # the model's own map, in its own dtype
        finally:
            _BUSY[0] -= 1
        return out


@contextmanager
def mode_inside(module: nn.Module, make_mode: Callable[[], TorchFunctionMode]) -> Iterator[None]:
    """While active, every forward of `module` runs inside a fresh make_mode() mode.

    The pre-hook enters the mode and the (always-called) forward hook leaves it; should a
    forward raise before that, `finally` unwinds what is left so no mode outlives the block.
    """
    entered: list[TorchFunctionMode] = []

    def pre(_m, _args):
        mode = make_mode()
        mode.__enter__()
        entered.append(mode)

    def post(_m, _args, _out):
        if entered:
            entered.pop().__exit__(None, None, None)

    try:
        with hooks(lambda: module.register_forward_pre_hook(pre),
                   lambda: module.register_forward_hook(post, always_call=True)):
            yield
    finally:
        while entered:
            entered.pop().__exit__(None, None, None)


_NONE = object()


@contextmanager
def mode_around_forward(module: nn.Module, make_mode: Callable[[], TorchFunctionMode]) -> Iterator[None]:
    """As mode_inside, in the form dynamo traces into a compiled graph (base.TRACED_HOOKS): the module's
    forward is wrapped, as an attribute of the instance, in `with make_mode():` (a mode entered in
    a pre-hook and left in a forward hook breaks the graph). `finally` puts the forward back."""
    own = module.__dict__.get("forward", _NONE)
    inner = module.forward

    def forward(*args, **kwargs):
        with make_mode():
            return inner(*args, **kwargs)

    module.forward = forward
    try:
        yield
    finally:
        if own is _NONE:
            module.__dict__.pop("forward", None)
        else:
            module.forward = own


def _watching(callback: Callable[[Probs], None]) -> Callable[[], AttentionMode]:
    """A fresh mode per forward that hands callback the probabilities, and callback.on_scores the logits
    of a model's own softmax first, when the callback has it (base.py)."""
    return lambda: AttentionMode(lambda _kind, probs, _q: callback(probs), getattr(callback, "on_scores", None))


def watch_probs(module: nn.Module, callback: Callable[[Probs], None]):
    """Context manager: callback(probs [B, H, Tq, Tk]) for each attention call inside module."""
    return mode_inside(module, _watching(callback))


def watch_probs_traced(module: nn.Module, callback: Callable[[Probs], None]):
    """watch_probs in the form dynamo traces (mode_around_forward)."""
    return mode_around_forward(module, _watching(callback))
