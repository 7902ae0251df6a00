"""The verdict rules on hand-set effects: "matters" needs significance and a size outside the band,
significant inside the band is "detectable but negligible", and agreement compares matters / negligible /
undecided across methods."""

from __future__ import annotations

from types import SimpleNamespace

from diagnose.ablation.contrast import negligible
from diagnose.ablation.result import HeadEffect
from diagnose.ablation.verdict import agreement, verdict

BAND = {"loss": 0.1, "accuracy": 0.02, "min_effect": 0.05}


def _head(delta_loss: float, ci: list[float], significant: bool, *, layer: int = 0, head: int = 0,
          verified: bool = True) -> HeadEffect:
    h = HeadEffect(layer, head, 0.9, 0.0, [0.0, 0.0], 1.0, 1.0, significant, 1.0, delta_loss, 0.0, 0.0, 0.0, 0.0,
                   verified, delta_loss_ci=ci, p_value_loss_adjusted=0.001 if significant else 0.5)
    h.negligible = negligible(h, BAND)
    h.verdict = verdict(h, BAND)
    return h


def test_matters_needs_significance_and_size():
    assert _head(0.5, [0.4, 0.6], True).verdict == "matters"
    assert _head(-0.5, [-0.6, -0.4], True).verdict == "matters"  # removing it helps: it still matters
    assert _head(0.01, [0.005, 0.02], True).verdict == "detectable but negligible"  # the demo's padding heads
    assert _head(0.05, [0.01, 0.3], True).verdict == "detectable but negligible"  # inside the band, CI reaches out
    assert _head(0.01, [-0.02, 0.03], False).verdict == "negligible"
    assert _head(0.5, [-0.2, 1.2], False).verdict == "undecided"
    assert _head(0.5, [0.4, 0.6], True, verified=False).verdict is None


def test_agreement_names_the_heads_whose_verdict_depends_on_the_method():
    def result(*heads):
        return SimpleNamespace(heads=list(heads),
                               head=lambda layer, h: next(x for x in heads if (x.layer, x.head) == (layer, h)))

    zero = result(_head(2.0, [1.5, 2.5], True), _head(0.01, [0.005, 0.02], True, head=1))
    mean = result(_head(0.0, [-0.01, 0.01], False), _head(0.0, [-0.01, 0.01], False, head=1))
    got = agreement({"zero": zero, "mean": mean})
    assert got["depends"] == [[0, 0]] and got["n_compared"] == 2 and got["n_depends"] == 1
    rows = {(r["layer"], r["head"]): r for r in got["heads"]}
    assert rows[(0, 0)]["verdicts"] == {"zero": "matters", "mean": "negligible"} and rows[(0, 0)]["agree"] is False
    assert rows[(0, 1)]["agree"] is True  # detectable but negligible agrees with negligible


def test_a_contradiction_is_told_from_a_question_of_power():
    """matters under one method and negligible under another contradicts; firm under one and undecided under
    another depends on the method too, but only the first is a contradiction."""
    def result(*heads):
        return SimpleNamespace(heads=list(heads),
                               head=lambda layer, h: next(x for x in heads if (x.layer, x.head) == (layer, h)))

    zero = result(_head(2.0, [1.5, 2.5], True), _head(0.0, [-0.01, 0.01], False, head=1))
    mean = result(_head(0.0, [-0.01, 0.01], False), _head(0.5, [-0.2, 1.2], False, head=1))
    got = agreement({"zero": zero, "mean": mean})
    assert got["depends"] == [[0, 0], [0, 1]] and got["contradicts"] == [[0, 0]]
