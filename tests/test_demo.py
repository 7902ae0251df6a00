"""The demo end to end (quick mode) and one lesson pair, measured by diagnose itself."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.demo import markdown_table, run_lessons

pytestmark = pytest.mark.numerics


@pytest.mark.slow
def test_quick_demo_writes_models_analyses_and_report(tmp_path):
    out = tmp_path / "demo"
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        res = CliRunner().invoke(cli, ["demo", "--out", str(out), "--quick", "--no-lessons"])
        assert torch.get_num_threads() == 2  # the demo runs on one thread and gives the caller's back
    finally:
        torch.set_num_threads(threads)
    assert res.exit_code == 0, res.output
    for task in ("induction", "order", "padding"):
        for name in ("model.pt", "eval.pt", "heads.json", "checks.json"):
            assert (out / task / name).is_file(), (task, name)
        assert (out / "runs" / task / "metrics.jsonl").is_file()
        heads = json.loads((out / task / "heads.json").read_text())
        m = heads["model"]
        assert heads["schema"] == "diagnose.heads/2" and len(heads["heads"]) == m["n_layers"] * m["n_heads"]
    assert (out / "report.html").stat().st_size > 10_000
    # the induction model's circuit: the previous-token head read by the induction head through its keys
    circuit = json.loads((out / "induction" / "circuit.json").read_text())
    assert circuit["schema"] == "diagnose.circuit/1" and circuit["circuit"]["reached"]
    assert any(e["composition"] == "K" for e in circuit["circuit"]["edges"])
    assert "induction" in {h["role"] for h in circuit["heads"]}
    html = (out / "report.html").read_text()
    assert '<section id="circuit">' in html and 'class="circuit-link"' in html
    assert str((out / "report.html").resolve()) in res.output
    # the files the demo wrote are what the other commands take
    res = CliRunner().invoke(cli, ["check", str(out / "order" / "model.pt")])
    assert res.exit_code == 0, res.output


@pytest.mark.slow
def test_positions_lesson_is_measured(tmp_path):
    path = run_lessons(tmp_path, quick=True, only=["positions"], log=lambda _: None)
    data = json.loads(path.read_text())
    assert data["schema"] == "diagnose.lessons/1" and [les["key"] for les in data["lessons"]] == ["positions"]
    rows = {r["metric"]: r for r in data["lessons"][0]["rows"]}
    acc = rows["eval accuracy (order task)"]
    assert acc["a"] > 0.9 and acc["b"] < 0.65  # without positions the order task is at chance
    assert rows["diagnose check: positions"]["a"] == "passes"
    assert "positional" in rows["diagnose check: positions"]["b"].lower()
    assert "| Positional information" in markdown_table(data)
