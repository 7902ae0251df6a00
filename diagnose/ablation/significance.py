"""Paired significance of each head's effect on per-example correctness.

The unit of evidence is the example: tokens of one sequence are not independent, so a
token-level test would overstate significance. For each example the ablated minus clean
accuracy is compared by an exact two-sided sign test (binomial on the examples that got
better vs worse). When every example has one scored unit (sequence classification)
this is exactly McNemar's exact test on the discordant pairs. For token tasks it tests
the median per-example change without assuming a symmetric distribution (which Wilcoxon
would). The 95 % interval for the change in unit-level accuracy comes from a seeded
paired bootstrap over examples; Holm's step-down method corrects across heads.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import binom

TEST = "exact sign test on per-example accuracy (= exact McNemar when one unit per example)"
CORRECTION = "holm"


def sign_test(diff: np.ndarray) -> np.ndarray:
    """Two-sided exact sign test per column.  diff [N, M] -> p [M]"""
    diff = np.asarray(diff, dtype=np.float64).reshape(diff.shape[0], -1)
    up = (diff > 0).sum(0)
    down = (diff < 0).sum(0)
    n = up + down
    p = np.minimum(1.0, 2.0 * binom.cdf(np.minimum(up, down), n, 0.5))
    return np.where(n == 0, 1.0, p)


def bootstrap_ci(d_correct: np.ndarray, count: np.ndarray, *, level: float = 0.95, n_boot: int = 2000,
                 seed: int = 0) -> np.ndarray:
    """Percentile CI of sum(d_correct) / sum(count), resampling examples with replacement.

    d_correct [N, M] (ablated minus clean correct units per example and head), count [N]
    (scored units per example). The same resamples serve every head.  -> [M, 2]
    """
    d_correct = np.asarray(d_correct, dtype=np.float64)
    count = np.asarray(count, dtype=np.float64)
    n, m = d_correct.shape
    if n == 0:
        return np.full((m, 2), np.nan)
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_boot, 4_000_000 // max(n, 1)))  # keep the weight matrix small
    stats = []
    for start in range(0, n_boot, chunk):
        w = rng.multinomial(n, np.full(n, 1.0 / n), size=min(chunk, n_boot - start)).astype(np.float64)  # [R, N]
        den = w @ count  # [R]
        stats.append((w @ d_correct) / np.where(den > 0, den, np.nan)[:, None])  # [R, M]
    boot = np.concatenate(stats)  # [n_boot, M]
    tail = (1.0 - level) / 2 * 100
    return np.nanpercentile(boot, [tail, 100 - tail], axis=0).T


def holm(p: np.ndarray) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (same order as p)."""
    p = np.asarray(p, dtype=np.float64)
    m = p.size
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adjusted
    return out
