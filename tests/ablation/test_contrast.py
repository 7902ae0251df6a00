"""Rank correlations and the two flags, on hand-made heads."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from diagnose.ablation.contrast import (backup_test, correlations, default_band, flags, look_alikes, negligible,
                                       redundant_flag, spearman)
from diagnose.ablation.result import ATTENTION_STATS, HeadEffect
from ..tolerance import F64, approx

pytestmark = pytest.mark.numerics


def head(layer, h, *, dacc, dloss, p, att, grad=0.5):
    stats = {k: 0.1 for k in ATTENTION_STATS}
    stats.update(att)
    return HeadEffect(layer, h, 0.9 + dacc, dacc, [dacc - 0.01, dacc + 0.01], p, p, p < 0.05, 1.0 + dloss, dloss,
                      abs(dloss), grad, grad, dloss, True, stats)


def test_spearman_matches_scipy_and_skips_missing():
    x, y = [1.0, 2.0, 3.0, 4.0, None, 6.0], [2.0, 1.0, 4.0, 3.0, 9.0, 5.0]
    rho, p = spearmanr([1, 2, 3, 4, 6], [2, 1, 4, 3, 5])
    got = spearman(x, y)
    assert got == {"rho": approx(rho, dtype=F64, width=5), "p_value": approx(p, dtype=F64, width=5), "n": 5}
    assert spearman([1, 1, 1, 1], [1, 2, 3, 4])["rho"] is None  # constant: undefined, not NaN


def test_correlations_cover_every_statistic():
    rng = np.random.default_rng(0)
    heads = [head(0, i, dacc=0.0, dloss=float(d), p=0.5, att={"entropy": float(-d)}) for i, d in
             enumerate(rng.random(6))]
    out = correlations(heads)
    assert out["effect"] == "delta_loss"
    assert out["entropy"]["rho"] == approx(-1.0, dtype=F64, width=5)
    assert set(ATTENTION_STATS) | {"grad_importance"} <= set(out)


def crowd(n=6, layer=5):
    """Ordinary heads of the same model: a little weight everywhere, no effect."""
    return [head(layer, i, dacc=0.0, dloss=0.0, p=1.0, att={}) for i in range(n)]


def test_flags_with_reasons_ranked():
    inert = head(0, 0, dacc=0.0, dloss=0.0004, p=0.9, att={"first_token": 0.93, "max_weight": 0.95})
    vital = head(0, 1, dacc=-0.3, dloss=0.8, p=1e-9, att={"max_weight": 0.2, "first_token": 0.1, "entropy": 2.1})
    decisive_and_vital = head(1, 0, dacc=-0.3, dloss=0.8, p=1e-9, att={"prev_token": 0.9, "max_weight": 0.9})
    diffuse_inert = head(1, 1, dacc=0.0, dloss=0.0, p=1.0, att={"max_weight": 0.2})
    out = flags([inert, vital, decisive_and_vital, diffuse_inert, *crowd()], baseline_loss=0.5)
    assert [(f["kind"], f["layer"], f["head"], f["rank"]) for f in out] == [("diffuse_but_vital", 0, 1, 1),
                                                                            ("striking_but_inert", 0, 0, 2)]
    # its peak (0.95) is on the first token (0.93): the reason names the role, not just "a key"
    assert "93%" in out[1]["reason"] and "on the first token" in out[1]["reason"]
    assert "typical for this model: 10%" in out[1]["reason"] and "negligible band" in out[1]["reason"]
    assert "spread out" in out[0]["reason"] and "-30.0%" in out[0]["reason"]


def test_striking_is_relative_to_the_model():
    """In a model whose heads all pile their weight on [SEP], one more such head is not striking;
    the one head that looks at the previous token is."""
    sep = [head(0, i, dacc=0.0, dloss=0.0, p=1.0, att={"last_token": 0.85 + 0.01 * (i % 3), "max_weight": 0.9})
           for i in range(8)]
    prev = head(1, 0, dacc=0.0, dloss=0.0, p=1.0, att={"prev_token": 0.8, "max_weight": 0.8})
    out = flags([*sep, prev], baseline_loss=0.5)
    assert [(f["layer"], f["head"]) for f in out] == [(1, 0)]
    assert "on the previous token" in out[0]["reason"]


def test_inert_means_equivalence_not_a_failed_test():
    """Not significant is not inert: a wide interval that reaches past the band gets no flag."""
    unsure = head(0, 0, dacc=-0.05, dloss=0.01, p=0.3, att={"first_token": 0.9, "max_weight": 0.9})
    unsure.delta_accuracy_ci = [-0.12, 0.01]
    sure = head(0, 1, dacc=0.0, dloss=0.001, p=1.0, att={"first_token": 0.9, "max_weight": 0.9})
    sure.delta_loss_ci = [-0.002, 0.004]
    heads = [unsure, sure, *crowd()]
    assert [(f["layer"], f["head"]) for f in flags(heads, baseline_loss=0.5)] == [(0, 1)]
    wide = head(0, 1, dacc=0.0, dloss=0.001, p=1.0, att={"first_token": 0.9, "max_weight": 0.9})
    wide.delta_loss_ci = [-0.002, 0.04]  # loss interval past 5 % of the baseline loss
    assert flags([unsure, wide, *crowd()], baseline_loss=0.5) == []
    assert negligible(sure, default_band(0.5)) and not negligible(wide, default_band(0.5))
    assert default_band(0.001)["loss"] == 1e-3  # a floor for near-perfect models


def test_a_peak_on_no_named_role_is_a_single_key():
    h = head(0, 0, dacc=0.0, dloss=0.0, p=1.0, att={"first_token": 0.3, "prev_token": 0.2, "max_weight": 0.9})
    (f,) = flags([h, *crowd()], baseline_loss=0.5)
    assert "90% of its attention goes on a single key" in f["reason"]


def test_inert_twins_are_called_redundant():
    a = head(0, 0, dacc=0.0, dloss=0.0, p=1.0, att={"prev_token": 0.9})
    b = head(0, 1, dacc=0.0, dloss=0.0, p=1.0, att={"prev_token": 0.8})
    c = head(1, 0, dacc=0.0, dloss=0.0, p=1.0, att={"prev_token": 0.8})
    out = flags([a, b, c, *crowd()], baseline_loss=0.5)
    assert len(out) == 3
    out.sort(key=lambda f: (f["layer"], f["head"]))
    assert "1 other head(s) of layer 0 look the same" in out[0]["reason"] and out[0]["twins"] == [[0, 1]]
    assert "twins" not in out[2]
    tested = backup_test(out[0], {"delta_accuracy": -0.25, "delta_loss": 0.7})
    assert tested["reason"].endswith("closed together with its look-alike(s) L0.H1, accuracy moves -25.0% "
                                     "and loss +0.7000")
    assert "may cover" not in tested["reason"] and tested["together"]["delta_loss"] == 0.7
    together = {"delta_accuracy": -0.25, "delta_loss": 0.7}
    assert backup_test(out[0], together, singles=-0.002)["reason"].endswith(
        "against -0.2% for each removed alone, added up: so it backs them up")
    assert backup_test(out[0], together, singles=-0.248)["reason"].endswith("so it is not their backup")
    assert "other head" not in out[2]["reason"]


def test_look_alike_groups_and_the_redundant_flag():
    a = head(1, 0, dacc=-0.007, dloss=0.02, p=1e-10, att={"max_weight": 0.86})
    b = head(1, 1, dacc=-0.002, dloss=0.01, p=1e-4, att={"max_weight": 0.85})
    c = head(1, 2, dacc=0.0, dloss=0.0, p=1.0, att={"max_weight": 0.3})  # diffuse: not a look-alike
    d = head(0, 0, dacc=-0.5, dloss=2.0, p=1e-30, att={"prev_token": 0.9})  # alone in its layer and role
    assert look_alikes([a, b, c, d, *crowd()]) == [("max_weight", [(1, 0), (1, 1)])]
    by = {(h.layer, h.head): h for h in (a, b, c, d)}
    flag = redundant_flag("max_weight", [(1, 0), (1, 1)], by, {"delta_accuracy": -0.7, "delta_loss": 5.0})
    assert flag["kind"] == "redundant_group" and flag["heads"] == [[1, 0], [1, 1]]
    assert flag["reason"].startswith("L1.H0, L1.H1 each put 85% or more of their attention on a single key")
    assert "(-0.7%, -0.2%)" in flag["reason"] and "accuracy moves -70.0%" in flag["reason"]
    # no flag when together costs what the singles add up to, or when a member matters alone
    assert redundant_flag("max_weight", [(1, 0), (1, 1)], by, {"delta_accuracy": -0.01, "delta_loss": 0.0}) is None
    by[(1, 1)] = head(1, 1, dacc=-0.05, dloss=0.3, p=1e-9, att={"max_weight": 0.85})
    assert redundant_flag("max_weight", [(1, 0), (1, 1)], by, {"delta_accuracy": -0.7, "delta_loss": 5.0}) is None
