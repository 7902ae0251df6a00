"""Per-example sums over a sweep, and the per-head effects and tests drawn from them.

`Accumulator` collects the clean and ablated losses batch by batch (plus the gradient sums the
--fast estimates need); `head_effects` turns them into one `HeadEffect` per head, with the
paired tests, bootstrap intervals and the multiple-testing correction across the heads tested.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import significance
from .result import ATTENTION_STATS, HeadEffect


class Accumulator:
    """Per-example sums over the whole data set: clean, and per head ablated."""

    def __init__(self, n_heads: int):
        self.n_heads = n_heads
        self.loss_sum, self.correct, self.count = [], [], []
        self.ab_loss, self.ab_correct = [], []  # lists of [B, M] arrays (NaN: head not ablated)
        # logit difference label - wrong, where the data names wrong answers: per batch [B] sums and units,
        # and [B, M] ablated sums (empty lists: not measured)
        self.diff, self.diff_count, self.ab_diff = [], [], []
        self.kl = np.zeros(n_heads)
        self.michel = np.zeros(n_heads)  # sum over examples of |d L_b / d xi_h|, L_b the example's mean loss
        self.linear = np.zeros(n_heads)  # sum over examples of d loss_sum_b / d xi_h
        self.fisher = np.zeros(n_heads)  # sum over examples of (d loss_sum_b / d xi_h) ** 2 / units_b
        self.n_scored_examples = 0

    def add_clean(self, clean) -> None:
        self.loss_sum.append(clean.loss_sum.double().cpu().numpy())
        self.correct.append(clean.correct.double().cpu().numpy())
        count = clean.count.double().cpu().numpy()
        self.count.append(count)
        if getattr(clean, "diff_sum", None) is not None:
            self.diff.append(clean.diff_sum.double().cpu().numpy())
            self.diff_count.append(clean.diff_count.double().cpu().numpy())
        if clean.grads is not None:
            g = torch.cat(clean.grads, dim=1).double().cpu().numpy()  # [B, M]
            scored = count > 0
            self.michel += (np.abs(g[scored]) / count[scored, None]).sum(0)
            self.linear += g.sum(0)
            self.fisher += (g[scored] ** 2 / count[scored, None]).sum(0)
            self.n_scored_examples += int(scored.sum())

    def add_ablated(self, ablated: dict, batch_index: int | None = None) -> None:
        B = self.loss_sum[-1 if batch_index is None else batch_index].shape[0]
        loss, correct = np.full((B, self.n_heads), np.nan), np.full((B, self.n_heads), np.nan)
        diff = np.full((B, self.n_heads), np.nan) if self.diff else None
        for m, a in ablated.items():
            loss[:, m] = a.loss_sum.double().cpu().numpy()
            correct[:, m] = a.correct.double().cpu().numpy()
            self.kl[m] += a.kl_sum
            if diff is not None and a.diff_sum is not None:
                diff[:, m] = a.diff_sum.double().cpu().numpy()
        self.ab_loss.append(loss)
        self.ab_correct.append(correct)
        if diff is not None:
            self.ab_diff.append(diff)

    @property
    def n_examples(self) -> int:
        return int(sum(len(x) for x in self.count))

    def arrays(self):
        cat = np.concatenate
        loss_sum, correct, count = cat(self.loss_sum), cat(self.correct), cat(self.count)
        if not self.ab_loss:  # fast mode with nothing to verify
            empty = np.full((len(count), self.n_heads), np.nan)
            return loss_sum, correct, count, empty, empty
        return loss_sum, correct, count, cat(self.ab_loss), cat(self.ab_correct)

    def units(self) -> float:
        return float(max(sum(float(c.sum()) for c in self.count), 1.0))

    def clean_accuracy(self) -> float:
        return sum(float(c.sum()) for c in self.correct) / self.units()

    def clean_loss(self) -> float:
        return sum(float(c.sum()) for c in self.loss_sum) / self.units()

    def clean_logit_diff(self) -> float | None:
        """The clean logit difference per unit that names a wrong answer (None: the data names none)."""
        if not self.diff:
            return None
        return float(np.concatenate(self.diff).sum()) / max(float(np.concatenate(self.diff_count).sum()), 1.0)

    def grad_raw(self) -> np.ndarray:
        return self.michel / max(self.n_scored_examples, 1)

    def estimated_delta_loss(self) -> np.ndarray:
        return -self.linear / self.units()  # first order: L(xi = 0) - L(xi = 1) = -dL/dxi

    def second_order_delta_loss(self) -> np.ndarray:
        """Taylor to second order, L(0) - L(1) = -L' + L''/2, the curvature by the empirical Fisher
        (Gauss-Newton for cross-entropy: E (d loss_b / d xi) ** 2, per scored unit)."""
        return (-self.linear + 0.5 * self.fisher) / self.units()

    def fast_score(self, rank_by: str) -> np.ndarray:
        return {"estimated_delta_loss": self.estimated_delta_loss, "grad_importance_raw": self.grad_raw,
                "second_order_delta_loss": self.second_order_delta_loss}[rank_by]()


def head_effects(acc: Accumulator, heads: list[tuple[int, int]], n_sites: int, chosen: list[int], *, alpha: float,
                 n_boot: int, seed: int, correction: str, summary: dict | None) -> list[HeadEffect]:
    """One HeadEffect per (site, head) of `heads`; exact fields only for the `chosen` (ablated) ones."""
    idx = np.array(sorted(int(m) for m in chosen), dtype=int)
    arrays = acc.arrays()
    tests = paired_tests(arrays, idx, alpha=alpha, n_boot=n_boot, seed=seed, correction=correction)
    estimates = _estimates(acc, heads, n_sites)
    exact = {int(m): j for j, m in enumerate(idx)}
    diffs = _logit_diffs(acc, idx, n_boot=n_boot, seed=seed)
    return [HeadEffect(layer=s, head=h, attention=_stats_for(summary, s, h),
                       **(_exact_fields(acc, arrays, tests, m, exact[m], alpha) if m in exact else _UNVERIFIED),
                       **(diffs[m] if m in diffs else {}),
                       **{k: float(v[m]) for k, v in estimates.items()})
            for m, (s, h) in enumerate(heads)]


def _logit_diffs(acc: Accumulator, idx: np.ndarray, *, n_boot: int, seed: int) -> dict[int, dict[str, Any]]:
    """Per ablated head m: its logit difference per unit, the change from clean, and the paired bootstrap
    interval of that change (the resamples of the loss interval); {} when the data names no wrong answers."""
    if not acc.diff or not acc.ab_diff or not len(idx):
        return {}
    clean, count, ablated = np.concatenate(acc.diff), np.concatenate(acc.diff_count), np.concatenate(acc.ab_diff)
    return logit_diff_changes(clean, count, ablated, idx, n_boot=n_boot, seed=seed)


def logit_diff_changes(clean: np.ndarray, count: np.ndarray, ablated: np.ndarray, idx: np.ndarray, *, n_boot: int,
                       seed: int) -> dict[int, dict[str, Any]]:
    """Per column m of idx: the logit difference per unit with m removed, its change from clean, and the paired
    bootstrap interval of that change; clean [N] and ablated [N, M] per-example sums over count [N] units."""
    units = max(float(count.sum()), 1.0)
    delta = ablated[:, idx] - clean[:, None]  # [N, M_chosen]
    ci = significance.bootstrap_ci(delta, count, n_boot=n_boot, seed=seed)
    return {int(m): {"logit_diff": float(ablated[:, m].sum()) / units,
                     "delta_logit_diff": float(delta[:, j].sum()) / units,
                     "delta_logit_diff_ci": [float(ci[j, 0]), float(ci[j, 1])]} for j, m in enumerate(idx)}


_UNVERIFIED = dict(accuracy=None, delta_accuracy=None, delta_accuracy_ci=None, p_value=None, p_value_adjusted=None,
                   significant=None, loss=None, delta_loss=None, kl=None, verified=False)


def paired_tests(arrays: tuple, idx: np.ndarray, *, alpha: float, n_boot: int, seed: int,
           correction: str) -> dict[str, np.ndarray]:
    """The accuracy and loss tests for the heads `idx`, each array indexed like idx."""
    loss_sum, correct, count, ab_loss, ab_correct = arrays
    if not len(idx):
        none = np.zeros(0)
        return {"p": none, "p_adj": none, "ci": np.zeros((0, 2)), "p_loss": none, "p_loss_adj": none,
                "loss_ci": np.zeros((0, 2))}
    scored = count > 0
    d_correct = ab_correct[:, idx] - correct[:, None]  # [N, M_chosen]
    d_loss = ab_loss[:, idx] - loss_sum[:, None]  # [N, M_chosen] summed over each example's units
    p = significance.sign_test(d_correct[scored] / count[scored, None])
    flips = significance.flips_needed(len(idx), alpha)
    p_loss = significance.sign_flip_test(significance.signed_ranks(d_loss[scored]), n_flips=flips, seed=seed)
    return {"p": p, "p_adj": significance.adjust(p, correction),
            "ci": significance.bootstrap_ci(d_correct, count, n_boot=n_boot, seed=seed),
            "p_loss": p_loss, "p_loss_adj": significance.adjust(p_loss, correction),
            "loss_ci": significance.bootstrap_ci(d_loss, count, n_boot=n_boot, seed=seed)}


def _exact_fields(acc: Accumulator, arrays: tuple, tests: dict[str, np.ndarray], m: int, j: int,
                  alpha: float) -> dict[str, Any]:
    """The fields exact ablation fills for head m (column j of the tests)."""
    loss_sum, correct, _, ab_loss, ab_correct = arrays
    units = acc.units()
    base_acc, base_loss = float(correct.sum()) / units, float(loss_sum.sum()) / units
    accuracy, loss = float(ab_correct[:, m].sum()) / units, float(ab_loss[:, m].sum()) / units
    return dict(accuracy=accuracy, delta_accuracy=accuracy - base_acc,
                delta_accuracy_ci=[float(tests["ci"][j, 0]), float(tests["ci"][j, 1])],
                p_value=float(tests["p"][j]), p_value_adjusted=float(tests["p_adj"][j]),
                significant=bool(tests["p_loss_adj"][j] < alpha), loss=loss, delta_loss=loss - base_loss,
                kl=float(acc.kl[m]) / units, verified=True,
                delta_loss_ci=[float(tests["loss_ci"][j, 0]), float(tests["loss_ci"][j, 1])],
                p_value_loss=float(tests["p_loss"][j]), p_value_loss_adjusted=float(tests["p_loss_adj"][j]))


def _estimates(acc: Accumulator, heads: list[tuple[int, int]], n_sites: int) -> dict[str, np.ndarray]:
    """The cheap per-head numbers from the clean passes; grad_importance l2-normalised within each layer."""
    raw = acc.grad_raw()
    norm = np.zeros_like(raw)
    for s in range(n_sites):
        members = [m for m, (ss, _) in enumerate(heads) if ss == s]
        scale = float(np.linalg.norm(raw[members]))
        norm[members] = raw[members] / scale if scale > 0 else 0.0
    return {"grad_importance": norm, "grad_importance_raw": raw, "estimated_delta_loss": acc.estimated_delta_loss(),
            "second_order_delta_loss": acc.second_order_delta_loss()}


def _stats_for(summary: dict | None, s: int, h: int) -> dict[str, float | None]:
    if not summary:
        return {k: None for k in ATTENTION_STATS}
    per_site = summary["stats"][s]
    return {k: (None if per_site.get(k) is None else float(per_site[k][h])) for k in ATTENTION_STATS}
