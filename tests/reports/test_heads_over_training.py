"""The report of a run with per-head importance draws every head's importance over training (one map per
attention layer), the heads that matter at the end, and marks the head events on the loss curve."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser

import pytest
from click.testing import CliRunner

import report_fixtures as rf
from diagnose.cli.main import cli

pytestmark = pytest.mark.numerics

EVENTS = [rf.alert(20, "head_vital", "info", "L1.H0", "importance 0.9, among the top heads", "not a failure"),
          rf.alert(20, "induction_phase_change", "info", "model", "in-context score fell", "not a failure"),
          rf.alert(30, "induction_head", "info", "L1.H0", "induction share 0.8", "not a failure")]


def _run_with_importance(run_dir):
    """write_run's folder, each sampled record given an importance per head: L1.H0 rises from 0.01 to 0.9
    at step 20, every other head stays at 0.01."""
    rf.write_run(run_dir, steps=40, n_layers=2, n_heads=2, attention_every=10, alerts=EVENTS)
    lines = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for layer, (site, st) in enumerate((rec.get("attention") or {}).items()):
            st["importance"] = [0.9 if (layer, h) == (1, 0) and rec["step"] >= 20 else 0.01 for h in range(2)]
        lines.append(json.dumps(rec))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir


class _Page(HTMLParser):
    """Each figure's (caption, decoded SVG) and the head-events table's rows."""

    def __init__(self):
        super().__init__()
        self.svgs, self.captions, self.events, self._in_caption = [], [], [], False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img" and a.get("src", "").startswith("data:image/svg+xml;base64,"):
            self.svgs.append(base64.b64decode(a["src"].split(",", 1)[1]).decode("utf-8"))
        if tag == "tr" and "data-kind" in a:
            self.events.append((int(a["data-step"]), a["data-kind"], a["data-where"]))
        if tag == "figcaption":
            self._in_caption = True
            self.captions.append("")

    def handle_endtag(self, tag):
        if tag == "figcaption":
            self._in_caption = False

    def handle_data(self, data):
        if self._in_caption:
            self.captions[-1] += data


@pytest.fixture
def other_plots_quick(monkeypatch):
    """The run's other pictures replaced by an empty SVG: this test is about the heads' two."""
    from diagnose.reports import _plots_training as plots

    dot = "data:image/svg+xml;base64,PHN2Zy8+"
    for name in ("loss_lr", "grad_norms", "depth_over_time", "entropy", "throughput", "eval_metrics"):
        monkeypatch.setattr(plots, name, lambda v: dot)
    monkeypatch.setattr(plots, "head_map", lambda v, m: dot)


def test_report_of_a_run_draws_every_heads_importance_and_marks_the_events(tmp_path, other_plots_quick):
    run = _run_with_importance(tmp_path / "run")
    result = CliRunner().invoke(cli, ["report", str(run), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    page = _Page()
    page.feed((tmp_path / "r.html").read_text())
    assert page.events == [(20, "head_vital", "L1.H0"), (20, "induction_phase_change", "model"),
                           (30, "induction_head", "L1.H0")]
    maps = page.captions.index("Importance of every head over training (|dL/dgate|), one map per attention layer")
    lines = [i for i, c in enumerate(page.captions) if c.startswith("Loss with the head events marked")]
    assert len(lines) == 1 and len(page.svgs) == len(page.captions)
    assert "L0 (blocks.0.attn)" in page.svgs[maps] and "L1 (blocks.1.attn)" in page.svgs[maps]  # a map a layer
    loss = page.svgs[lines[0]]
    assert "L1.H0 vital" in loss and "L1.H0 induction" in loss and "phase change" in loss  # marked, named
    assert "L1.H0" in loss.replace("L1.H0 vital", "").replace("L1.H0 induction", "")  # its line's legend
    assert not any(c.startswith("importance") and "per head over time" in c for c in page.captions)  # drawn once


def test_a_run_without_importance_has_no_heads_view(tmp_path):
    from diagnose.reports._sources import load_sources
    from diagnose.reports._view_training import training_view

    run = rf.write_run(tmp_path / "run", steps=20, n_layers=1, n_heads=2, attention_every=10)
    assert training_view("r", load_sources([run]).runs[0].run).heads_over is None


def test_the_in_context_score_sampled_on_some_steps_is_drawn_through_them(tmp_path):
    """icl_score is declared for a plot and logged on sampled steps only: its curve holds one point per
    sampled step (a line through NaN gaps drew nothing), and the page shows it under its field's label."""
    from diagnose.reports._sources import load_sources
    from diagnose.reports._view_training import training_view

    run = rf.write_run(tmp_path / "run", steps=40, n_layers=1, n_heads=2, attention_every=10)
    lines = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["step"] % 10 == 0:
            rec["icl_score"] = -rec["step"] / 10
        lines.append(json.dumps(rec))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    view = training_view("r", load_sources([run]).runs[0].run)
    ((label, (steps, values)),) = view.curves
    assert label == "in-context score (late - early)"
    assert list(steps) == [0, 10, 20, 30] and list(values) == [0.0, -1.0, -2.0, -3.0]
    result = CliRunner().invoke(cli, ["report", str(run), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    page = _Page()
    page.feed((tmp_path / "r.html").read_text())
    assert "in-context score (late - early) over time" in page.captions
