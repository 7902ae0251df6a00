"""Paired significance of each head's effect on per-example correctness.

The unit of evidence is the example: tokens of one sequence are not independent, so a
token-level test would overstate significance. For each example the ablated minus clean
accuracy is compared by an exact two-sided sign test (binomial on the examples that got
better vs worse). When every example has one scored unit (sequence classification)
this is exactly McNemar's exact test on the discordant pairs. For token tasks it tests
the median per-example change without assuming a symmetric distribution (which Wilcoxon
would). The 95 % interval for the change in unit-level accuracy comes from a seeded
paired bootstrap over examples; Holm's step-down method corrects across heads.

The accuracy test throws away what the loss knows, and with a few hundred examples it can
only see large effects (`min_detectable_accuracy` says how large). So each head's change in
loss is tested too, with a sign-flip permutation test on the signed ranks of the per-example
change in summed loss (Wilcoxon's statistic, its null distribution by flipping signs: exact
under the null that the change is symmetric about zero, no normality assumed, and robust to
the few examples whose loss moves a lot, which swamp a test on the raw mean); that test
drives `significant`. Holm is the default correction; Benjamini-Hochberg (false
discovery rate) is the option for screening many heads.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import binom

TEST = "exact sign test on per-example accuracy (= exact McNemar when one unit per example)"
LOSS_TEST = "sign-flip permutation test on the signed ranks of the per-example change in loss (Wilcoxon statistic)"
DRIVES = "delta_loss"  # which test decides `significant`
CORRECTION = "holm"
CORRECTIONS = ("holm", "bh")
N_FLIPS = 9999  # at least; raised so that the smallest p can pass the strictest corrected level


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
    return _step(p, lambda ps, m: np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * ps)))


def sign_flip_test(diff: np.ndarray, *, n_flips: int = N_FLIPS, seed: int = 0) -> np.ndarray:
    """Two-sided paired permutation test of sum(diff) = 0 per column: each example's change keeps
    its size and gets a random sign; p = (1 + #{|flipped sum| >= |observed|}) / (1 + n_flips).
    The same flips serve every column (one matrix product per chunk).  diff [N, M] -> p [M]"""
    diff = np.asarray(diff, dtype=np.float64)
    n, m = diff.shape
    if n == 0 or m == 0:
        return np.ones(m)
    observed = np.abs(diff.sum(0))  # [M]
    slack = 1e-9 * np.abs(diff).sum(0)  # rounding of the flipped sums must not count against a tie
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_flips, 4_000_000 // n))
    hits = np.zeros(m)
    for start in range(0, n_flips, chunk):
        signs = rng.integers(0, 2, size=(min(chunk, n_flips - start), n)).astype(np.float64) * 2 - 1  # [R, N]
        hits += (np.abs(signs @ diff) >= observed - slack).sum(0)
    p = (1.0 + hits) / (1.0 + n_flips)
    return np.where(np.abs(diff).sum(0) == 0, 1.0, p)


def signed_ranks(diff: np.ndarray) -> np.ndarray:
    """Per column: sign(d) * rank of |d| among the non-zero entries (ties averaged), 0 where d is 0."""
    from scipy.stats import rankdata

    diff = np.asarray(diff, dtype=np.float64)
    mag = np.abs(diff)
    ranks = rankdata(np.where(mag > 0, mag, np.nan), axis=0, nan_policy="omit")
    return np.where(mag > 0, np.sign(diff) * np.nan_to_num(ranks), 0.0)


def flips_needed(m: int, alpha: float) -> int:
    """Flips so that the smallest attainable p, 1 / (1 + n), clears alpha / m (with margin)."""
    return max(N_FLIPS, int(np.ceil(20 * max(m, 1) / alpha)))


def bh(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (false discovery rate; same order as p)."""
    return _step(p, lambda ps, m: np.minimum(1.0, np.minimum.accumulate((ps * m / np.arange(1, m + 1))[::-1])[::-1]))


def _step(p: np.ndarray, adjust_sorted) -> np.ndarray:
    """A step-wise correction: adjust_sorted(p ascending, m) -> adjusted, put back in p's order."""
    p = np.asarray(p, dtype=np.float64)
    m = p.size
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    out = np.empty(m)
    out[order] = adjust_sorted(p[order], m)
    return out


def adjust(p: np.ndarray, correction: str) -> np.ndarray:
    """Holm (family-wise error) or Benjamini-Hochberg (false discovery rate)."""
    return {"holm": holm, "bh": bh}[correction](p)


def min_detectable_examples(m: int, alpha: float) -> int:
    """The fewest examples that must all change one way before the exact sign test can pass the
    first (strictest) corrected level alpha / m, for Holm and Benjamini-Hochberg alike:
    two-sided p = 2 * 0.5 ** k < alpha / m."""
    return int(np.floor(np.log2(2 * max(m, 1) / alpha))) + 1
