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
    out = " ".join(result.stdout.split())  # the console wraps the one line at its width
    assert out.count("Direct effects not measured") == 1 and "measured: no head was ablated exactly (--top 0)" in out
    result = CliRunner().invoke(cli, ["heads", "post.pt", "--data", "d.pt", "--no-direct", "--json", "h.json"])
    assert result.exit_code == 0 and "Direct effects" not in result.stdout
    assert json.loads((tmp_path / "h.json").read_text())["direct"] is None


TAKEOVER = "tests.ablation.planted_takeover"


def test_hand_written_model_without_adapter_flags_the_compensated_head(tmp_path, monkeypatch):
    """The planted takeover (tests/ablation/planted_takeover.py), a nanoGPT-style model no adapter declares:
    its path is traced, the writer is compensated and flagged so, never striking_but_inert."""
    from ..ablation.planted_takeover import planted_takeover, takeover_data, with_unknown_norm

    monkeypatch.chdir(tmp_path)
    torch.save(planted_takeover().state_dict(), tmp_path / "w.pt")
    torch.save(with_unknown_norm().state_dict(), tmp_path / "odd.pt")
    torch.save(takeover_data(), tmp_path / "data.pt")
    args = ["--data", "data.pt", "--json", "heads.json", "--batch-size", "16"]
    result = CliRunner().invoke(cli, ["heads", "w.pt", *args, "--factory", f"{TAKEOVER}:planted_takeover"])
    assert result.exit_code == 0, result.output
    assert "1 compensated" in " ".join(result.stdout.split())
    data = json.loads((tmp_path / "heads.json").read_text())
    assert data["direct"]["measured"] and data["direct"]["path"].startswith("traced")
    kinds = {(f["layer"], f["head"]): f["kind"] for f in data["flags"]}
    assert kinds[(0, 0)] == "striking_but_compensated"
    # the same model with a final norm nothing declares: one line says which part, why and the fix
    result = CliRunner().invoke(cli, ["heads", "odd.pt", *args, "--factory", f"{TAKEOVER}:with_unknown_norm"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())  # the console wraps the one line at its width
    assert out.count("Direct effects not measured") == 1, result.stdout
    assert "Direct effects not measured: the final norm, ln_f (OddRMSNorm)," in out and "register_norm(OddRMSNorm" in out
    data = json.loads((tmp_path / "heads.json").read_text())
    flag = next(f for f in data["flags"] if (f["layer"], f["head"]) == (0, 0))
    assert flag["kind"] == "striking_but_inert" and "may make up for it (self-repair)" in flag["reason"]
