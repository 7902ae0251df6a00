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
    u = torch.nn.functional.normalize(x, dim=-1)  # [B, T, C] unit rows
    if mask is None:  # the common training case: no mask passes over the tensor
        mean = x.mean()
        var = (x - mean).square().mean()
        max_abs = x.abs().amax()
        token_cos = ((u.sum(1).square().sum(-1) - T) / max(T * (T - 1), 1)).mean() if T > 1 else x.new_zeros(())
        return torch.stack([mean, var, max_abs, token_cos])
    # Few, fused passes: this runs for every block at every logged training step.
    w = mask.to(x.device, torch.float32)[..., None]  # [B, T, 1]
    xw = x * w  # padding zeroed
    n = w.sum() * C
    mean = xw.sum() / n
    var = ((xw * x).sum() / n - mean * mean).clamp_min(0)  # E[x^2] - mean^2 over real tokens
    max_abs = xw.abs().amax()
    u = u * w  # unit rows, padding zeroed
    k = w.sum((1, 2))  # [B] real positions per example
    pair_sum = u.sum(1).square().sum(-1) - k  # sum over i != j of cos(x_i, x_j)   # [B]
    pairs = (k * (k - 1)).clamp_min(1)
    has_pairs = (k > 1).float()
    token_cos = (pair_sum / pairs * has_pairs).sum() / has_pairs.sum().clamp_min(1)
    return torch.stack([mean, var, max_abs, token_cos])
