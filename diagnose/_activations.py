"""Reductions of a residual-stream tensor that stay on the device (no host sync).

Shared by `capture` (per forward) and `TrainingMonitor` (per logged step).
"""

from __future__ import annotations

import torch

from .adapters import float32_only

STAT_NAMES = ("mean", "var", "max_abs", "token_cos")


@torch.no_grad()
def hidden_stats(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """[mean, var, max |x|, mean cosine similarity between positions] of x [B, T, C] -> [4].

    mask [B, T] (1 real, 0 padding) excludes padding from every statistic. token_cos is the
    mean over examples of the mean cosine similarity between distinct real positions; it tends
    to 1 when token representations collapse to one direction (rank collapse).
    """
    rows, unit_sum, w = hidden_partial(x, mask)
    return hidden_finish(rows[None], unit_sum[None], w)[0]


@torch.no_grad()
def hidden_partial(x: torch.Tensor, mask: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What hidden_stats needs of x [B, T, C]: (rows [4, B, T], unit_sum [B, C], weights [B, T]).

    This runs for every block at every logged training step, so x is read in four passes that
    reduce over channels (row norms, row sums, row min and max) plus one batched matrix product
    for the sum of unit rows, and nothing of x's size is allocated. The rest, on [B, T], is left
    to hidden_finish, which the monitor runs once for all blocks of a step (it was half the cost).
    """
    with float32_only(x.device):  # under torch.autocast the bmm below would run in bf16/fp16
        return _partial(x.detach().float(), mask)


def _partial(x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if x.dim() == 2:
        x = x[None]
    B, T, C = x.shape
    w = x.new_ones(B, T) if mask is None else mask.to(x.device, torch.float32)  # [B, T]
    norm = torch.linalg.vector_norm(x, dim=-1)  # [B, T]
    lo, hi = x.amin(-1), x.amax(-1)  # [B, T] each (aminmax(dim=) is 10x slower on CPU)
    rows = torch.stack([norm, x.sum(-1), lo, hi])  # [4, B, T]
    unit_sum = torch.bmm((w / norm.clamp_min(1e-12))[:, None, :], x)[:, 0]  # [B, C]: sum of the real unit rows
    return rows, unit_sum, w


@torch.no_grad()
def hidden_finish(rows: torch.Tensor, unit_sum: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """hidden_stats of L tensors of one shape at once: rows [L, 4, B, T], unit_sum [L, B, C],
    weights [B, T] shared by all -> [L, 4].

    Cosines use sum_{i != j} u_i . u_j = |sum_i u_i|^2 - sum_i |u_i|^2 with u the unit rows.
    """
    C = unit_sum.shape[-1]
    norm, row_sum, lo, hi = rows.unbind(1)  # [L, B, T] each
    wd = w.double()
    n = (wd.sum() * C).clamp_min(1)
    mean = (row_sum.double() * wd).sum((-2, -1)) / n  # [L]
    var = ((norm.double().square() * wd).sum((-2, -1)) / n - mean * mean).clamp_min(0)  # over real tokens
    max_abs = (torch.maximum(hi, -lo) * w).amax((-2, -1))  # [L]
    self_sim = (w * norm / norm.clamp_min(1e-12)).square().sum(-1)  # [L, B]: sum_i |u_i|^2 (0 for a zero row)
    k = w.sum(1)  # [B] real positions per example
    pairs = (k * (k - 1)).clamp_min(1)
    has_pairs = (k > 1).float()
    token_cos = ((unit_sum.square().sum(-1) - self_sim) / pairs * has_pairs).sum(-1) / has_pairs.sum().clamp_min(1)
    stats = {"mean": mean.float(), "var": var.float(), "max_abs": max_abs, "token_cos": token_cos}
    return torch.stack([stats[name] for name in STAT_NAMES], dim=-1)  # [L, S], in STAT_NAMES order
