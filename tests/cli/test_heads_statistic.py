"""A new attention statistic is one registry entry: registered, it is computed, written in the heads
JSON (and its rank correlation), printed in the `diagnose heads` table, and shown in the report's
tables and plots, with no other change."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from click.testing import CliRunner

import diagnose
from diagnose.cli.main import cli
from diagnose.reports import _plots_heads as plots
from diagnose.reports.view_heads import heads_view
from diagnose.zoo import ModelConfig, Transformer

from ..test_attention_stats_registry import TOY, toy  # noqa: F401  (the fixture that registers TOY)


@pytest.fixture
def saved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    lm = Transformer(ModelConfig(kind="lm", vocab_size=6, max_len=8, n_layers=2, n_heads=2, d_model=16, init_std=0.3))
    diagnose.save_checkpoint(lm, tmp_path / "lm.pt", meta={"task": "lm"})
    torch.save({"input_ids": torch.randint(1, 6, (16, 8))}, tmp_path / "data.pt")  # few ids: many repeats
    return tmp_path


def _header(out: str) -> list[str]:
    """The column headers of the printed table (rich wraps a long one over several lines)."""
    lines = out.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    end = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    cells = [[c.strip() for c in line.strip("┃").split("┃")] for line in lines[top + 1:end]]
    return [" ".join(filter(None, column)) for column in zip(*cells)]


def test_a_registered_statistic_reaches_the_json_the_cli_and_the_report(saved, toy, monkeypatch):
    result = CliRunner().invoke(cli, ["heads", "lm.pt", "--data", "data.pt", "--json", "h.json", "--html", "h.html"])
    assert result.exit_code == 0, result.output
    assert _header(result.stdout)[-4:] == ["entropy", "max weight", "first token", toy.column]  # from the registry
    doc = json.loads((saved / "h.json").read_text())
    values = [h["attention"][toy.name] for h in doc["heads"]]
    assert all(isinstance(x, float) and 0.0 <= x <= 1.0 for x in values) and max(values) > 0.0
    assert math.isfinite(doc["correlations"][toy.name]["rho"])  # correlated with the effect like the others
    html = (saved / "h.html").read_text()
    headers = re.findall(r"<th>(?:<bdi>)?([^<]*)(?:</bdi>)?</th>", html)  # a declared table's sit in <bdi>
    assert headers.count(toy.column) == headers.count("first token") >= 1  # every head table
    view = heads_view("h", doc)
    assert [c.statistic for c in view.correlations][-2:] == [toy.name, "grad_importance"]
    row = view.layers()[1].rows[0]
    assert row.label == "L1.H0" and row.values[toy.name] == pytest.approx(doc["heads"][2]["attention"][toy.name])
    drawn = []
    original = plots._grid
    monkeypatch.setattr(plots, "_grid", lambda ax, v, key, div: (drawn.append(key), original(ax, v, key, div)))
    assert plots.attention_grids(view) is not None and toy.name in drawn  # a grid of its own
    assert toy.name in plots.drawn(view, "scatter") and plots.scatter(view) is not None
