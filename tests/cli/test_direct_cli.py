"""`diagnose heads` end to end on saved files finds the planted compensated head (tests/ablation/planted_repair.py)."""

from __future__ import annotations

import json
import re

import torch
from click.testing import CliRunner

import diagnose
from diagnose.cli.main import cli
from diagnose.zoo import ModelConfig, Transformer

from ..ablation.planted_repair import planted_data, planted_repair


def test_saved_planted_model_flags_the_compensated_head(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    diagnose.save_checkpoint(planted_repair(), tmp_path / "repair.pt")
    torch.save(planted_data(), tmp_path / "data.pt")
    result = CliRunner().invoke(cli, ["heads", "repair.pt", "--data", "data.pt", "--json", "heads.json",
                                      "--batch-size", "16"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())
    assert "direct" in out and "Δloss" in out
    assert re.search(r"L0\.H0 .*│ \+0\.6\d+ \* *│.*\n.*│ comp\. ", result.stdout)  # the table's flag, under it
    assert "1 compensated" in out and "L0.H0 (direct +0.6" in out
    data = json.loads((tmp_path / "heads.json").read_text())
    assert data["schema"] == "diagnose.heads/2" and data["direct"]["measured"]
    by = {(h["layer"], h["head"]): h for h in data["heads"]}
    assert by[(0, 0)]["compensated"] is True and by[(0, 1)]["compensated"] is False
    assert by[(0, 0)]["direct_delta_loss"] > 0.3 and by[(0, 0)]["self_repair"] > 0.3


def test_no_direct_and_post_norm_say_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    post = Transformer(ModelConfig(kind="classifier", vocab_size=10, n_classes=2, max_len=6, n_layers=1, n_heads=2,
                                   d_model=8, norm="post"))
    diagnose.save_checkpoint(post, tmp_path / "post.pt")
    torch.save({"input_ids": torch.randint(1, 10, (8, 6)), "labels": torch.arange(8) % 2}, tmp_path / "d.pt")
    result = CliRunner().invoke(cli, ["heads", "post.pt", "--data", "d.pt"])  # post-norm: traced, so measured
    assert result.exit_code == 0, result.output
    assert "Direct effects (2 heads" in " ".join(result.stdout.split())
    result = CliRunner().invoke(cli, ["heads", "post.pt", "--data", "d.pt", "--fast", "--top", "0"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if "Direct effects not measured" in line]
    assert len(lines) == 1 and "--top 0" in lines[0], result.stdout
    result = CliRunner().invoke(cli, ["heads", "post.pt", "--data", "d.pt", "--no-direct", "--json", "h.json"])
    assert result.exit_code == 0 and "Direct effects" not in result.stdout
    assert json.loads((tmp_path / "h.json").read_text())["direct"] is None
