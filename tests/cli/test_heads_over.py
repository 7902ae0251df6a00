"""`diagnose heads-over` end to end on saved checkpoints: a head whose output is zeroed in the second checkpoint
is the one head named as having stopped mattering; bad input is one line and exit 2."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest
import torch
from click.testing import CliRunner

import diagnose
from diagnose.cli.main import cli
from diagnose.zoo import ModelConfig, Transformer

from ..ablation.planted_repair import planted_data, planted_repair

pytestmark = pytest.mark.numerics


def _writer_alone() -> Transformer:
    """The planted model without its repair (the MLP zeroed): L0.H0 writes the feature the classifier reads,
    so removing it costs the whole margin; L0.H1's weights are all zero, so removing it costs nothing."""
    model = planted_repair()
    with torch.no_grad():
        for p in model.blocks[0].mlp.parameters():
            p.zero_()
    return model


@pytest.fixture
def checkpoints(tmp_path, monkeypatch):
    """ckpt_100.pt: the writer at work; ckpt_200.pt: the same with L0.H0's output-projection slice zeroed."""
    monkeypatch.chdir(tmp_path)
    model = _writer_alone()
    diagnose.save_checkpoint(model, tmp_path / "ckpt_100.pt")
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.proj.weight[:, :attn.head_dim] = 0.0  # head 0's slice of the output projection  # [d, H * D]
    diagnose.save_checkpoint(model, tmp_path / "ckpt_200.pt")
    torch.save(planted_data(32), tmp_path / "data.pt")
    return tmp_path


class _Changes(HTMLParser):
    """The heads named by the page's 'what changed' list (data-head of each li), and the table's rows."""

    def __init__(self):
        super().__init__()
        self.changed, self.rows = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "li" and "data-kind" in a:
            self.changed.append((a["data-head"], a["data-kind"]))
        if tag == "tr" and "data-head" in a:
            self.rows.append(a["data-head"])


def test_the_zeroed_head_is_the_one_that_stopped_mattering(checkpoints):
    result = CliRunner().invoke(cli, ["heads-over", "ckpt_100.pt", "ckpt_200.pt", "--data", "data.pt",
                                      "--json", "over.json", "--html", "over.html"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())
    assert "L0.H0 stopped mattering from ckpt_100.pt to ckpt_200.pt: matters" in out
    data = json.loads((checkpoints / "over.json").read_text())
    assert data["schema"] == "diagnose.heads-over-checkpoints/1" and data["checkpoints"] == ["ckpt_100.pt",
                                                                                              "ckpt_200.pt"]
    assert [(c["layer"], c["head"], c["kind"]) for c in data["changes"]] == [(0, 0, "stopped mattering")]
    change = data["changes"][0]
    assert change["before"]["verdict"] == "matters" and change["after"]["verdict"] == "negligible"
    assert change["before"]["delta_loss_ci"][0] > 0.3  # the whole margin: log 2 against a loss near 0
    assert change["after"]["delta_loss_ci"] == [0.0, 0.0]  # nothing left to remove
    by = {(h["layer"], h["head"]): [c["verdict"] for c in h["cells"]] for h in data["heads"]}
    assert by == {(0, 0): ["matters", "negligible"], (0, 1): ["negligible", "negligible"]}
    made = CliRunner().invoke(cli, ["report", "over.json", "-o", "report.html"])
    assert made.exit_code == 0, made.output
    for html in ("over.html", "report.html"):  # heads-over --html, and diagnose report on its JSON
        page = _Changes()
        page.feed((checkpoints / html).read_text())
        assert page.changed == [("L0.H0", "stopped mattering")] and page.rows == ["L0.H0", "L0.H1"]


def _one_error_line(args: list[str], *words: str) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and all(w in lines[0] for w in words), lines
    assert "Traceback" not in result.output


def test_bad_checkpoints_are_one_line_and_exit_2(checkpoints):
    other = Transformer(ModelConfig(kind="classifier", vocab_size=4, n_classes=2, max_len=4, n_layers=1, n_heads=4,
                                    d_model=8, pooling="first", positions="none"))
    diagnose.save_checkpoint(other, checkpoints / "other.pt")
    _one_error_line(["heads-over", "ckpt_100.pt", "missing.pt", "--data", "data.pt", "--json", "o.json"],
                    "missing.pt")
    _one_error_line(["heads-over", "ckpt_100.pt", "other.pt", "--data", "data.pt", "--json", "o.json"],
                    "other.pt", "4 heads", "2 heads")
    _one_error_line(["heads-over", "ckpt_100.pt", "--data", "data.pt"], "at least two")
    assert not (checkpoints / "o.json").exists()  # nothing half-written


def test_report_refuses_a_damaged_heads_over_json_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cell = {"verdict": "matters", "delta_loss": 0.5, "delta_loss_ci": [0.4, 0.6]}
    doc = {"schema": "diagnose.heads-over-checkpoints/1", "checkpoints": ["a.pt", "b.pt"],
           "model": {"family": "reference", "n_layers": 1, "n_heads": 1}, "baselines": [{"loss": 0.1}] * 2,
           "heads": [{"layer": 0, "head": 0, "cells": [cell, dict(cell, delta_loss="0.5")]}], "changes": []}
    (tmp_path / "over.json").write_text(json.dumps(doc))
    _one_error_line(["report", "over.json", "-o", "r.html"], "over.json", "heads[0].cells[1].delta_loss",
                    "diagnose heads-over --json")
    assert not (tmp_path / "r.html").exists()
