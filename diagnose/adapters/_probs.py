"""Attention probabilities a few query rows at a time, so that no consumer needs [B, H, Tq, Tk] at once.

A pattern callback (base.PatternCallback) receives either a Tensor [B, H, Tq, Tk] (the model
wrote its own softmax, so the map already exists) or a `LazyProbs`: what SDPA would have
computed, recomputed from the very same q, k, mask and scale only when asked, `rows(start,
stop)` at a time. Statistics read `query_chunks(probs, budget)` and never hold more than
about `budget` elements per step; only consumers that promise full maps (capture) call
`materialise`. At T = 16,384 one head's full map is 1 GB in float32; a chunk of 64 query rows
is 4 MB.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Union

import torch


def float32_only(device: torch.device):
    """Context manager: autocast off on `device`, so float32 statistics stay float32 inside a model
    run under torch.autocast (which would otherwise do their matmuls and einsums in bf16/fp16)."""
    if device.type in ("cpu", "cuda"):  # the autocast device types of every torch >= 2.4
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()


class LazyProbs:
    """softmax(q k^T * scale + mask) of one SDPA call, computed by query rows on demand.

    Follows torch's reference semantics: scale defaults to 1/sqrt(D); is_causal keeps the
    lower triangle aligned top-left; a bool mask keeps True, a float mask is added; key heads
    are repeated for grouped-query attention; a row with every key masked gives zeros.
    Holds float32 copies of q [B, H, Tq, D] and k [B, Hkv, Tk, D] (O(T), not O(T^2)).
    """

    def __init__(self, query: torch.Tensor, key: torch.Tensor,
                 attn_mask: torch.Tensor | tuple[torch.Tensor | None, ...] | None = None,
                 is_causal: bool = False, scale: float | None = None):
        self.q = query.detach().float()  # [B, H, Tq, D]
        self.k = key.detach().float()  # [B, Hkv, Tk, D]
        masks = attn_mask if isinstance(attn_mask, (tuple, list)) else (attn_mask,)
        self.masks = [m.detach() for m in masks if m is not None]  # each broadcastable to [B, H, Tq, Tk], in order
        self.is_causal = bool(is_causal)
        self.scale = 1.0 / math.sqrt(self.q.shape[-1]) if scale is None else float(scale)
        B, H, Tq, _ = self.q.shape
        self.shape = torch.Size((B, H, Tq, self.k.shape[-2]))  # [B, H, Tq, Tk]
        self.device = self.q.device
        self.dtype = torch.float32

    def extent(self, stop: int) -> int:
        """How many keys queries before `stop` can see: under is_causal (top-left) only the first `stop`."""
        return min(stop, self.shape[-1]) if self.is_causal else self.shape[-1]

    def rows(self, start: int, stop: int, *, narrow: bool = False) -> torch.Tensor:
        """Probabilities of queries start..stop-1 against every key.  # [B, H, stop - start, Tk] float32

        narrow=True leaves out the keys no query of the chunk can see (is_causal): the result
        then has extent(stop) <= Tk columns, and the keys after them have weight 0.
        """
        with torch.no_grad():  # a `with`, not a decorator: dynamo cannot wrap a decorated bound method
            probs = torch.softmax(self.scores(start, stop, narrow=narrow), dim=-1)
            return probs.nan_to_num_(0.0) if self.masks else probs  # only a mask can hide every key of a row

    def scores(self, start: int, stop: int, *, narrow: bool = False) -> torch.Tensor:
        """The pre-softmax logits q k^T * scale of queries start..stop-1, hidden keys at -inf (the
        monitor's max attention logit reads them).  # [B, H, stop - start, Tk or extent(stop)] float32"""
        with torch.no_grad():  # as in rows()
            Tk = self.extent(stop) if narrow else self.shape[-1]
            q = self.q[..., start:stop, :]  # [B, H, c, D]
            k = self.k[..., :Tk, :]  # [B, Hkv, Tk, D]
            if k.shape[-3] != q.shape[-3]:
                k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
            with float32_only(q.device):
                scores = (q @ k.transpose(-2, -1)) * self.scale  # [B, H, c, Tk]
            if self.is_causal and start + 1 < Tk:  # only columns start + 1 .. are hidden from some row of the chunk
                q_pos = torch.arange(start, stop, device=q.device)[:, None]  # [c, 1]
                k_pos = torch.arange(start + 1, Tk, device=q.device)[None, :]
                scores[..., start + 1:].masked_fill_(k_pos > q_pos, float("-inf"))
            for m in self.masks:
                m = m[..., :Tk] if m.shape[-1] != 1 else m
                if m.dim() >= 2 and m.shape[-2] != 1:
                    m = m[..., start:stop, :]  # a mask with one row per query: this chunk's rows
                scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m.float()
            return scores

    def full(self) -> torch.Tensor:
        """Every row at once.  # [B, H, Tq, Tk] float32"""
        return self.rows(0, self.shape[-2])


Probs = Union[torch.Tensor, LazyProbs]  # what a pattern callback receives


def materialise(probs: Probs) -> torch.Tensor:
    """The whole map as a float32 tensor of its own (never the model's tensor).  # [B, H, Tq, Tk]"""
    return probs.full() if isinstance(probs, LazyProbs) else probs.detach().to(torch.float32, copy=True)


def query_chunks(probs: Probs, budget: int) -> Iterator[tuple[int, torch.Tensor]]:
    """(first query index, float32 rows [B, H, c, K]) with B * H * c * Tk at most about `budget`
    (at least one row per step). K <= Tk: keys from K on have weight 0 in every row of the
    chunk (a causal LazyProbs leaves them out, halving the work); a Tensor gives K = Tk."""
    B, H, Tq, Tk = probs.shape
    step = max(1, budget // max(1, B * H * Tk))
    for s in range(0, Tq, step):
        e = min(Tq, s + step)
        if isinstance(probs, LazyProbs):
            yield s, probs.rows(s, e, narrow=True)
        else:
            yield s, probs[..., s:e, :].detach().float()
