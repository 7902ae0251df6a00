"""Reductions of a residual-stream tensor that stay on the device (no host sync).

Shared by `capture` (per forward) and `TrainingMonitor` (per logged step).
"""

from __future__ import annotations

import torch

STAT_NAMES = ("mean", "var", "max_abs", "token_cos")


@torch.no_grad()
def hidden_stats(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """[mean, var, max |x|, mean cosine similarity between positions] of x [B, T, C] -> [4].

    mask [B, T] (1 real, 0 padding) excludes padding from every statistic. token_cos is the
    mean over examples of the mean cosine similarity between distinct real positions; it tends
    to 1 when token representations collapse to one direction (rank collapse).

    This runs for every block at every logged training step, so x is read in four passes that
    reduce over channels (row norms, row sums, row min and max) plus one batched matrix product
    for the sum of unit rows, and nothing of x's size is allocated; all the rest is on [B, T].
    Cosines use sum_{i != j} u_i . u_j = |sum_i u_i|^2 - sum_i |u_i|^2 with u the unit rows.
    """
    x = x.detach().float()
    if x.dim() == 2:
        x = x[None]
    B, T, C = x.shape
    w = x.new_ones(B, T) if mask is None else mask.to(x.device, torch.float32)  # [B, T]
    norm = torch.linalg.vector_norm(x, dim=-1)  # [B, T]
    row_sum = x.sum(-1)  # [B, T]
    lo, hi = x.amin(-1), x.amax(-1)  # [B, T] each (aminmax(dim=) is 10x slower on CPU)
    wd = w.double()
    n = (wd.sum() * C).clamp_min(1)
    mean = (row_sum.double() * wd).sum() / n
    var = ((norm.double().square() * wd).sum() / n - mean * mean).clamp_min(0)  # over real tokens
    max_abs = (torch.maximum(hi, -lo) * w).amax()
    safe = norm.clamp_min(1e-12)  # an all-zero row has no direction: it adds 0 to every cosine
    unit_sum = torch.bmm((w / safe)[:, None, :], x)[:, 0]  # [B, C]: sum of the real positions' unit rows
    self_sim = (w * norm / safe).square().sum(1)  # [B]: sum_i |u_i|^2
    k = w.sum(1)  # [B] real positions per example
    pairs = (k * (k - 1)).clamp_min(1)
    has_pairs = (k > 1).float()
    token_cos = ((unit_sum.square().sum(-1) - self_sim) / pairs * has_pairs).sum() / has_pairs.sum().clamp_min(1)
    return torch.stack([mean.float(), var.float(), max_abs, token_cos])
