"""How a receiver input moves when edges into it are removed: the senders' writes summed per replica (and per
receiver block), the sum of them all cached per forward so that a circuit's complement (every edge removed but
the kept few) costs the kept few, and the per-sender products for a few edges (patch.Patcher._removed)."""

from __future__ import annotations

from typing import Callable

import torch

SENDERS = 8  # senders whose changes are summed at a time inside a hook


def summed(write: Callable[[int], torch.Tensor], m: torch.Tensor, K: int, sums: dict) -> torch.Tensor:
    """sum_c m[k, c, j] write(c) over the senders c < n = m.shape[1] (global sender order), per replica k (and
    receiver block j). Where most are removed (a circuit's complement), the sum of all n writes (`prefix`,
    cached in `sums` for this forward) less the kept ones.  # [K, B, T, (J,) d]"""
    kept = float(m.sum()) > m.numel() / 2
    weight = 1.0 - m if kept else m
    cols = (weight.any(2) if m.dim() == 3 else weight).any(0).nonzero().flatten().tolist()
    out = None
    spec = "kbtcd,kcj->kbtjd" if m.dim() == 3 else "kbtcd,kc->kbtd"
    for i in range(0, len(cols), SENDERS):
        g = cols[i:i + SENDERS]
        delta = torch.stack([write(j) for j in g], dim=2)  # [K * B, T, c, d]
        delta = delta.reshape(K, -1, *delta.shape[1:])  # [K, B, T, c, d]
        part = torch.einsum(spec, delta, weight[:, g].to(delta.device, delta.dtype))
        out = part if out is None else out + part
    if not kept:
        return out
    total = prefix(write, m.shape[1], sums)
    total = total.reshape(K, -1, *total.shape[1:])  # [K, B, T, d]
    if m.dim() == 3:
        total = total[:, :, :, None, :]
    return total if out is None else total - out


def prefix(write: Callable[[int], torch.Tensor], n: int, sums: dict) -> torch.Tensor:
    """The sum of senders 0..n-1's writes in this forward, built on the largest sum cached below n (the
    receivers run in sender order, so each write is added once per forward).  # [K * B, T, d]"""
    base = max((k for k in sums if k <= n), default=0)
    total = sums.get(base)
    for c in range(base, n):
        part = write(c)
        total = part if total is None else total + part
    sums[n] = total
    return total


def through(delta: torch.Tensor, w: torch.Tensor, m: torch.Tensor, D: int) -> torch.Tensor:
    """sum_c m[k, c, j] delta[k, :, :, c] @ w[:, block j] for every feature block j (D wide) -> [K, B, T, J * D].
    Few (replica, sender, block) triples (one edge per replica): each is one small product on its replica's
    rows; many (a circuit): one product per sender over every replica, masked per block. Never the
    [K, B, T, c, J * D] a single einsum would hold."""
    K, B, T, c, _ = delta.shape
    J = m.shape[2]
    out = delta.new_zeros(K, B, T, J, D)
    triples = m.nonzero().tolist()
    if len(triples) <= 2 * K:
        blocks = w.view(w.shape[0], J, D)  # [d, J, D]
        for k, ci, j in triples:
            out[k, :, :, j] += m[k, ci, j] * (delta[k, :, :, ci] @ blocks[:, j])
        return out.view(K, B, T, J * D)
    for ci in range(c):
        part = (delta[:, :, :, ci] @ w).view(K, B, T, J, D)  # [K, B, T, J, D]
        out += part * m[:, ci][:, None, None, :, None]
    return out.view(K, B, T, J * D)
