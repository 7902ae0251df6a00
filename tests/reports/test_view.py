"""View models and verdicts against independent computations on planted inputs."""

import base64
import math

import numpy as np
import pytest
from scipy.stats import spearmanr

import report_fixtures as rf
from diagnose.errors import InputFileError
from diagnose.reports._sources import load_sources
from diagnose.reports._summary import heads_verdict, training_verdict
from diagnose.reports.view_heads import MAX_TOKENS, MIN_TOKENS, heads_view
from diagnose.reports._view_training import group_alerts, training_view
from ..tolerance import F64, approx

pytestmark = pytest.mark.numerics

# A map value p is sent as the byte round(255 sqrt(p)): sqrt(p) is off by at most half a step d = 0.5/255,
# so p by at most 2 d sqrt(p) + d^2 <= 2 d + d^2 (a bound from the quantisation, not a float tolerance).
BYTE_SQUARED = 2 * (0.5 / 255) + (0.5 / 255) ** 2


def test_grids_significance_flags_and_ranking():
    doc = rf.make_heads(3, 4, vital=((2, 1), (0, 3)), inert=((1, 0),))
    v = heads_view("m", doc)
    for h in doc["heads"]:
        assert v.grids["delta_loss"][h["layer"], h["head"]] == h["delta_loss"]
        assert v.grids["max_weight"][h["layer"], h["head"]] == h["attention"]["max_weight"]
    assert set(zip(*np.nonzero(v.significant))) == {(2, 1), (0, 3)}
    assert {(h["layer"], h["head"]) for h in v.ranked[:2]} == {(2, 1), (0, 3)}
    assert [(f.layer, f.head, f.kind) for f in v.flags] == [(1, 0, "striking_but_inert")]
    c = next(c for c in v.correlations if (c.statistic, c.effect) == ("max_weight", "delta_loss"))
    direct = spearmanr(v.grids["max_weight"].ravel(), v.grids["delta_loss"].ravel())
    assert c.rho == approx(direct.statistic, dtype=F64) and c.n == 12
    given = next(c for c in v.correlations if (c.statistic, c.effect) == ("first_token", "delta_loss"))
    assert (given.rho, given.p_value) == (-0.123, 0.456)  # the document's own figure, not a recomputed one


def test_the_plots_mark_the_heads_that_matter_not_every_significant_one():
    doc = rf.make_heads(2, 2, vital=((1, 1), (0, 1)), inert=())
    small = next(h for h in doc["heads"] if (h["layer"], h["head"]) == (0, 1))
    small["verdict"] = "detectable but negligible"  # significant, but its effect lies inside the band
    v = heads_view("m", doc)
    assert v.significant[0, 1] and v.significant[1, 1]
    assert set(zip(*np.nonzero(v.matters))) == {(1, 1)}
    for h in doc["heads"]:  # none matters: the detectable ones are not "more" of anything
        h["verdict"] = "detectable but negligible" if h["significant"] else "negligible"
    text = " ".join(s for _, s in heads_verdict(heads_view("m", doc)).lines)
    assert "No single head matters" in text and "; 2 are detectable but negligible" in text


def test_the_view_recomputes_nothing_and_shows_less_for_an_older_document():
    doc = rf.make_heads(2, 2, vital=((1, 1),), inert=())
    doc["flags"] = [{"layer": 1, "head": 1, "kind": "diffuse_but_vital", "reason": "flat map, Δacc -0.2"}]
    v = heads_view("m", doc)
    assert v.flags[0].kind == "diffuse_but_vital" and v.flags[0].reason == "flat map, Δacc -0.2"
    assert v.n_significant == 1 and v.significant[1, 1]
    for h in doc["heads"]:
        del h["significant"]  # tiny p-values, but the document does not say which heads are significant
    del doc["correlations"]
    doc["flags"] = {"diffuse_but_vital": [{"layer": 1, "head": 1, "reason": "a shape nothing writes"}]}
    old = heads_view("m", doc)
    assert old.n_significant == 0 and old.correlations == [] and old.flags == []


def test_a_group_flag_is_labelled_by_its_heads_and_summarised():
    doc = rf.make_heads(2, 2, vital=(), inert=())
    doc["flags"] = [{"kind": "redundant_group", "layer": 1, "head": 0, "heads": [[1, 0], [1, 1]],
                     "reason": "L1.H0, L1.H1 ... they back each other up"}]
    v = heads_view("m", doc)
    assert v.flags[0].label == "L1.H0 + L1.H1"
    lines = dict(heads_verdict(v).lines)
    assert lines["Matter only together"] == "L1.H0, L1.H1 ... they back each other up." and "Other flags" not in lines


def test_examples_packed_and_decodable():
    doc = rf.make_heads(2, 3, seq_len=6, n_kept=2)
    v = heads_view("m", doc)
    assert len(v.examples) == 2
    ex = v.examples[1]
    q = np.frombuffer(base64.b64decode(ex["maps"][1][2]), dtype=np.uint8).reshape(6, 6)
    want = np.asarray(doc["examples"][1]["attention"][1][2])
    assert np.abs((q / 255.0) ** 2 - want).max() <= BYTE_SQUARED  # quantisation, not rounding
    assert ex["tokens"] == doc["examples"][1]["tokens"]


def test_examples_budget_and_truncation():
    doc = rf.make_heads(1, 2, seq_len=MAX_TOKENS + 10, n_kept=3)
    v = heads_view("m", doc, budget=2 * MAX_TOKENS ** 2)  # the first example fits, cut to MAX_TOKENS
    assert len(v.examples) == 1 and v.examples[0]["n_k"] == MAX_TOKENS
    assert "left out" in v.examples_note and f"first {MAX_TOKENS}" in v.examples_note


def test_a_big_model_shows_fewer_tokens_of_its_first_example_within_the_budget():
    """80 x 64 heads x 32 tokens is 5.2 MB of bytes for one example: over the page's budget, so
    its first tokens are shown (still at least MIN_TOKENS), and the maps are the file's."""
    doc = rf.make_heads(6, 5, seq_len=20, n_kept=2)
    v = heads_view("m", doc, budget=30 * 12 * 12 + 5)
    ex = v.examples[0]
    assert len(v.examples) == 1 and ex["n_k"] == ex["n_q"] == 12 and ex["tokens"] == doc["examples"][0]["tokens"][:12]
    assert "first 12 of 20 tokens" in v.examples_note and "1 more example(s) left out" in v.examples_note
    q = np.frombuffer(base64.b64decode(ex["maps"][4][3]), dtype=np.uint8).reshape(12, 12)
    want = np.asarray(doc["examples"][0]["attention"][4][3])[:12, :12]
    assert np.abs((q / 255.0) ** 2 - want).max() <= BYTE_SQUARED
    assert heads_view("m", doc, budget=1).examples[0]["n_k"] == MIN_TOKENS


def test_bad_examples_name_the_source():
    doc = rf.make_heads(2, 2)
    doc["examples"][0]["attention"] = [[[[1.0]]]]
    with pytest.raises(InputFileError, match="m: examples\\[0\\]"):
        heads_view("m", doc)


def test_heads_verdict_says_what_matters_and_what_does_not():
    v = heads_view("induction", rf.make_heads(2, 4, vital=((1, 2),), inert=((0, 1),)))
    text = " ".join(s for _, s in heads_verdict(v).lines)
    assert "1 of 8 heads" in text and "L1.H2" in text
    labels = dict(heads_verdict(v).lines)
    assert labels["Looks important but is not"].startswith("L0.H1")


def test_training_view_and_verdict(tmp_path):
    alerts = [rf.alert(40), rf.alert(90), rf.alert(30, kind="no_warmup", hint="add warmup"),
              rf.alert(150, kind="nonfinite", severity="error", message="loss is NaN")]
    run = rf.write_run(tmp_path / "r", steps=300, n_layers=3, alerts=alerts, nan_from=150)
    v = training_view("r", load_sources([run]).runs[0].run)
    assert v.layer_names == ["blocks.0", "blocks.1", "blocks.2"]
    assert v.first_step == 0 and v.last_step == 299 and v.n_alerts == 4
    assert [(g.number, g.kind, g.first_step, g.count) for g in v.alert_groups] == [
        (1, "no_warmup", 30, 1), (2, "grad_spike", 40, 2), (3, "nonfinite", 150, 1)]
    assert v.act_var[1].shape == (300, 3)
    assert v.act_var[1][0, 1] == approx(math.log10(1.1))
    e = v.entropy
    assert e.values.shape == (30, 12) and e.rows[:5] == [("blocks.0.attn", h) for h in range(4)] + [("blocks.1.attn", 0)]
    assert e.values[0, 0] == approx(2.0) and e.values[-1, 0] < 1.0 and e.values[-1, 1] == approx(2.0)
    lines = dict(training_verdict(v).lines)
    assert "no_warmup" in lines["What went wrong, and when"] and "step 150" in lines["What went wrong, and when"]
    assert lines["First fix to try"] == "add warmup"


def test_group_alerts_errors_win_ties():
    g = group_alerts([rf.alert(5, kind="a"), rf.alert(5, kind="b", severity="error")])
    assert [x.kind for x in g] == ["b", "a"]


def test_checks_verdict_counts_problems_not_information():
    from diagnose.reports._summary import checks_verdict

    info = {"check": "positions", "severity": "info", "title": "bidirectional"}
    err = {"check": "causal", "severity": "error", "title": "Future leaks"}
    v = checks_verdict([("a/checks", [info]), ("b/checks", [info, err])])
    assert v.lines[0] == ("a/checks", "no check found a problem (1 informational finding(s)).")
    assert v.lines[1] == ("b/checks", "1 problem(s), 1 error(s): Future leaks (error).")


def test_lessons_verdict_quotes_the_first_measure():
    from diagnose.reports._summary import lessons_verdict

    v = lessons_verdict(rf.make_lessons()["lessons"])
    assert v.lines == [("Warmup", "Without warmup, <b>gradient spikes</b> early. Measured: max grad norm "
                                  "1.23 (warmup) vs 45.7 (no-warmup).")]
