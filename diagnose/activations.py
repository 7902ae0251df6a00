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
    """
    x = x.detach().float()
    if x.dim() == 2:
        x = x[None]
    B, T, C = x.shape
    w = torch.ones(B, T, device=x.device) if mask is None else mask.to(x.device, torch.float32)  # [B, T]
    n = w.sum() * C
    mean = (x * w[..., None]).sum() / n
    var = (((x - mean) ** 2) * w[..., None]).sum() / n
    max_abs = (x.abs() * w[..., None]).amax()
    u = torch.nn.functional.normalize(x, dim=-1) * w[..., None]  # [B, T, C], padding zeroed
    k = w.sum(1)  # [B] real positions per example
    pair_sum = (u.sum(1) ** 2).sum(-1) - k  # sum over i != j of cos(x_i, x_j)   # [B]
    pairs = (k * (k - 1)).clamp_min(1)
    has_pairs = (k > 1).float()
    token_cos = (pair_sum / pairs * has_pairs).sum() / has_pairs.sum().clamp_min(1)
    return torch.stack([mean, var, max_abs, token_cos])
