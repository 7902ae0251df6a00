"""The paired tests against textbook formulas and scipy."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest
from scipy.stats import binomtest, wilcoxon

from diagnose.ablation.significance import (adjust, bh, bootstrap_ci, holm, min_detectable_examples, sign_flip_test,
                                           sign_test, signed_ranks)

from ..tolerance import F64, approx

pytestmark = pytest.mark.numerics


def mcnemar_exact(b: int, c: int) -> float:
    """Exact McNemar by hand: two-sided binomial on the b + c discordant pairs."""
    n = b + c
    tail = sum(comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def test_binary_correctness_gives_exact_mcnemar():
    rng = np.random.default_rng(0)
    clean = rng.integers(0, 2, (200, 5))
    ablated = clean.copy()
    ablated[:40, 0] = 0  # head 0: lost 40 examples that were right
    ablated[:6, 1] = 1 - ablated[:6, 1]  # head 1: a few flips both ways
    p = sign_test(ablated - clean)
    for m in range(5):
        b = int(((clean[:, m] == 1) & (ablated[:, m] == 0)).sum())
        c = int(((clean[:, m] == 0) & (ablated[:, m] == 1)).sum())
        assert p[m] == approx(mcnemar_exact(b, c), width=len(clean), dtype=F64)
    assert p[0] < 1e-6 and p[2] == 1.0


def test_sign_test_on_fractional_differences_matches_binomtest():
    diff = np.array([0.5, -0.25, 0.1, 0.0, 0.3, 0.2, 0.0, 0.7])[:, None]  # per-example accuracy changes
    want = binomtest(5, 6, 0.5).pvalue
    assert sign_test(diff)[0] == approx(want, width=len(diff), dtype=F64)


def test_holm_step_down():
    p = np.array([0.01, 0.04, 0.03, 0.005])
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 -> 0.02, 0.03, 0.06, 0.06 (monotone)
    assert holm(p).tolist() == approx([0.03, 0.06, 0.06, 0.02], dtype=F64, width=4)
    assert holm(np.array([0.9, 0.8])).tolist() == [1.0, 1.0]


def test_bootstrap_ci_is_seeded_and_covers_the_estimate():
    rng = np.random.default_rng(1)
    count = rng.integers(1, 5, 300).astype(float)
    d = np.stack([-(rng.random(300) < 0.2).astype(float) * count, np.zeros(300)], 1)  # head 0 loses ~20 % of units
    ci = bootstrap_ci(d, count, n_boot=1000, seed=3)
    again = bootstrap_ci(d, count, n_boot=1000, seed=3)
    assert np.array_equal(ci, again)
    est = d[:, 0].sum() / count.sum()
    assert ci[0, 0] < est < ci[0, 1] < 0
    assert ci[1].tolist() == [0.0, 0.0]
    # the interval's width is about 2 * 1.96 standard errors of a ratio estimator
    se = np.sqrt(np.var(d[:, 0] - est * count) / len(count)) / count.mean()
    assert (ci[0, 1] - ci[0, 0]) == pytest.approx(2 * 1.96 * se, rel=0.2)


def test_sign_flip_on_signed_ranks_is_wilcoxon():
    """The permutation distribution of Wilcoxon's statistic, sampled: p near scipy's exact p."""
    rng = np.random.default_rng(2)
    d = np.stack([rng.standard_t(2, 40) + 0.5, rng.normal(0, 1, 40), rng.normal(0, 1, 40) * 1e-3 + 1e-3], 1)
    d[:4, 1] = 0.0  # zeros drop out, as in wilcoxon(zero_method="wilcox")
    p = sign_flip_test(signed_ranks(d), n_flips=40000, seed=1)
    for m in range(3):
        want = wilcoxon(d[:, m][d[:, m] != 0], method="exact").pvalue
        assert p[m] == pytest.approx(want, abs=3 * np.sqrt(want * (1 - want) / 40000) + 2e-4), m
    assert np.array_equal(p, sign_flip_test(signed_ranks(d), n_flips=40000, seed=1))  # seeded
    assert sign_flip_test(np.zeros((10, 1)))[0] == 1.0
    # one example per flip cannot beat 1 / (n_flips + 1): the smallest p is bounded by the flips
    assert sign_flip_test(np.ones((30, 1)), n_flips=999)[0] == approx(1 / 1000, dtype=F64)


def test_benjamini_hochberg_by_hand():
    p = np.array([0.01, 0.04, 0.03, 0.005])
    # sorted 0.005, 0.01, 0.03, 0.04 -> * 4/1, 4/2, 4/3, 4/4 = 0.02, 0.02, 0.04, 0.04 (monotone from the top)
    assert bh(p).tolist() == approx([0.02, 0.04, 0.04, 0.02], dtype=F64, width=4)
    assert adjust(p, "bh").tolist() == bh(p).tolist() and adjust(p, "holm").tolist() == holm(p).tolist()
    assert (bh(p) <= holm(p)).all()  # BH never rejects fewer


@pytest.mark.parametrize("m", [1, 4, 72, 144])
def test_min_detectable_examples_is_the_first_passing_count(m):
    k = min_detectable_examples(m, 0.05)
    everyone = lambda n: sign_test(-np.ones((n, 1)))[0]  # n examples all lost, none gained
    assert everyone(k) < 0.05 / m <= everyone(k - 1)
