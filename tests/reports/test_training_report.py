"""The training part of the report: what the loss did, one step axis for every panel, the entropy
heatmap on its true steps and an absolute scale, several runs overlaid, and the run's evaluations,
throughput, clipping and saved spike batches (each left out for folders that lack them)."""

from __future__ import annotations

import html
import json
import math
import re
import shutil

import numpy as np
import pytest

import report_fixtures as rf
from diagnose.reports import render_html
from diagnose.reports._sources import load_sources
from diagnose.reports._summary import loss_sentence, training_verdict
from diagnose.reports._view import build_report
from diagnose.reports._view_training import column_edges, loss_summary, training_view
from ..tolerance import approx

pytestmark = pytest.mark.numerics


@pytest.fixture
def quick_plots(monkeypatch):
    """Pictures replaced by an empty SVG: these tests are about what is shown, not the drawing."""
    from diagnose.reports import _plots_training as plots

    dot = "data:image/svg+xml;base64,PHN2Zy8+"
    for name in ("loss_lr", "grad_norms", "depth_over_time", "entropy", "throughput", "eval_metrics", "compare"):
        monkeypatch.setattr(plots, name, lambda v: dot)


def _view(run_dir, name="r"):
    return training_view(name, load_sources([run_dir]).runs[0].run)


def test_loss_summary_is_the_logged_values_and_says_where_the_loss_stopped_being_finite():
    steps = np.arange(10, 20, dtype=float)
    loss = np.array([5.5, 9.0, 120.0, 8.0, 6.1, math.nan, math.nan, math.nan, math.nan, math.nan])
    s = loss_summary(steps, loss)
    assert (s.start, s.start_step, s.end_step) == (5.5, 10, 19) and math.isnan(s.end)  # the NaN end is said
    assert (s.min, s.min_step, s.max, s.max_step) == (5.5, 10, 120.0, 12)
    assert (s.nonfinite_from, s.nonfinite_count, s.finite_again) == (15, 5, False)
    text = loss_sentence(s)
    assert "5.5 at step 10 (first logged) → nan at step 19 (last logged)" in text
    assert "maximum 120 at step 12" in text and "not finite from step 15 on (5 logged steps)" in text
    loss[-1] = 4.0  # recovered: said as a count, not "from ... on"
    assert "not finite at 4 logged steps, first at step 15" in loss_sentence(loss_summary(steps, loss))
    assert "not finite" not in loss_sentence(loss_summary(steps[:5], loss[:5]))


def test_verdict_quotes_the_summary_of_a_run_that_went_nan(tmp_path):
    v = _view(rf.write_run(tmp_path / "r", steps=100, nan_from=70))
    (run_line,) = [t for label, t in training_verdict(v).lines if label == "Run"]
    raw = v.loss[1]
    assert f"first logged) → nan at step 99" in run_line and "not finite from step 70 on (30 logged steps)" in run_line
    assert f"minimum {np.nanmin(raw):.4g} at step {int(v.loss[0][np.nanargmin(raw)])}" in run_line


def test_entropy_columns_start_where_the_samples_were_taken_on_an_absolute_scale(tmp_path):
    v = _view(rf.write_run(tmp_path / "r", steps=120, attention_every=50))
    e = v.entropy
    assert list(e.steps) == [0, 50, 100]  # not bin centres: nothing drawn before step 0
    assert list(column_edges(e.steps, v.last_step)) == [0, 50, 100, 119]
    assert e.uniform == approx(math.log(16))
    assert list(column_edges(np.array([0.0, 10.0]), 10)) == [0, 10, 20]  # sampled at the last step: one interval


def test_older_run_folders_show_without_the_new_fields(tmp_path):
    v = _view(rf.write_run(tmp_path / "r", steps=50))
    assert v.evals is None and v.tokens_per_s is None and v.step_time is None and v.clipping is None
    assert v.spikes == []
    labels = dict(training_verdict(v).lines)
    assert "Also logged" not in labels


def test_evals_throughput_clipping_and_spikes(tmp_path):
    run = rf.write_run(tmp_path / "r", steps=100, clip=1.1, throughput=True, evals_every=25, spike_steps=[60, 30])
    v = _view(run)
    assert list(v.evals.steps) == [0, 25, 50, 75] and list(v.evals.metrics) == ["accuracy"]
    assert v.evals.loss[1] == approx(2.5 * math.exp(-0.5) + 0.1)
    grad = [json.loads(line)["grad_norm"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert v.clipping.clip == 1.1 and v.clipping.share == approx(np.mean(np.array(grad) > 1.1))
    assert v.tokens_per_s_median == approx(np.median([40960.0] * 50 + [20480.0] * 50))
    assert [s.step for s in v.spikes] == [30, 60]
    assert v.spikes[0].tensors[0] == ("input_ids", "8×16", "int64") and v.spikes[0].bytes == 2080
    also = dict(training_verdict(v).lines)["Also logged"]
    assert "4 evaluations, the last: loss" in also and "tokens/s" in also and "clipped at 1.1, scaling" in also
    # a torn evals line and a damaged spike record are skipped: side files never stop the report
    with open(run / "evals.jsonl", "a") as f:
        f.write('{"step": 99, "loss"')
    (run / "spikes" / "step_00000070.json").write_text("{not json")
    v = _view(run)
    assert len(v.evals.steps) == 4 and [s.step for s in v.spikes] == [30, 60]


def test_every_run_shares_one_step_axis_and_several_runs_are_overlaid(tmp_path, quick_plots):
    a = rf.write_run(tmp_path / "a", steps=300, alerts=[rf.alert(40)])
    b = rf.write_run(tmp_path / "b", steps=120, seed=1, alerts=[rf.alert(90, kind="divergence", severity="error")])
    rep = build_report(load_sources([a, b]))
    views = [s.view for s in rep.training]
    assert [v.xlim for v in views] == [(0.0, 299.0)] * 2
    assert [v.prefix for v in views] == ["1.", "2."] and len({v.color for v in views}) == 2
    assert rep.compare is not None and rep.compare.views == views
    captions = [c for c, _ in rep.training[0].images]
    assert not any(c.startswith("Loss") for c in captions)  # the curves are overlaid, not stacked
    single = build_report(load_sources([b]))
    assert single.compare is None and single.training[0].view.xlim == (0.0, 119.0)
    assert single.training[0].images[0][0].startswith("Loss")


def test_two_run_page_overlays_and_escapes(tmp_path, quick_plots):
    a = rf.write_run(tmp_path / "a", steps=60, clip=1.1, throughput=True, evals_every=20, spike_steps=[30],
                     alerts=[rf.alert(30)])
    b = rf.write_run(tmp_path / "b", steps=40, seed=2)
    page = render_html([a, b])
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    assert "2 runs overlaid" in text and "Batches saved at spike alerts" in text and "Evaluations (3)" in text
    assert rf.XSS not in page and html.escape(rf.XSS) in page  # a spike note is data, shown as text
    assert re.search(r"1\.1\s+grad_spike", text)  # alert numbers carry the run's number


@pytest.mark.slow
def test_report_cli_takes_several_runs(tmp_path):
    from click.testing import CliRunner

    from diagnose.cli.main import cli

    a = rf.write_run(tmp_path / "runs" / "a", steps=40)
    b = rf.write_run(tmp_path / "runs" / "b", steps=30, seed=3)
    out = tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["report", str(a), str(b), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "2 runs overlaid" in out.read_text()
