"""`diagnose prune` end to end on saved files: a --factory nanoGPT-style model, the bad inputs
(one line, exit code 2, nothing written), the input never modified, and the report section."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.io import save_checkpoint
from diagnose.sites import find_heads
from diagnose.zoo import ModelConfig, Transformer

from .helpers import assert_close, digest, outputs
from .nano_heads import NanoHeads, build

pytestmark = pytest.mark.numerics

FACTORY = f"{Path(__file__).with_name('nano_heads.py')}:build"


def _lm_files(tmp_path):
    model = build()
    torch.save(model.state_dict(), tmp_path / "nano.pt")
    ids = torch.randint(1, 40, (12, 8), generator=torch.Generator().manual_seed(3))
    torch.save({"input_ids": ids}, tmp_path / "data.pt")
    return model, ids


def test_factory_model_prunes_and_rebuilds_from_heads_json(tmp_path, monkeypatch):
    monkeypatch.delenv("NANO_HEADS", raising=False)
    model, ids = _lm_files(tmp_path)
    before = digest(tmp_path / "nano.pt")
    out = tmp_path / "pruned"
    res = CliRunner().invoke(cli, ["prune", str(tmp_path / "nano.pt"), "--factory", FACTORY, "--data",
                                   str(tmp_path / "data.pt"), "--max-loss", "100", "--out", str(out),
                                   "--json", str(tmp_path / "prune.json"), "--html", str(tmp_path / "p.html")])
    assert res.exit_code == 0, res.output
    assert digest(tmp_path / "nano.pt") == before
    assert 'id="prune"' in (tmp_path / "p.html").read_text()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no work folder left
    d = json.loads((tmp_path / "prune.json").read_text())
    assert d["heads_left"] == [0, 0] and d["saved"]["form"] == "state_dict + factory"  # every head can go
    heads = json.loads((out / "heads.json").read_text())
    assert heads["heads_left"] == [0, 0]
    monkeypatch.setenv("NANO_HEADS", str(out / "heads.json"))
    again = build()  # the user's factory, told the new head counts
    again.load_state_dict(torch.load(out / "model.pt", weights_only=True), strict=True)
    reference = NanoHeads()  # no heads left: every attention output is its c_proj bias
    reference.load_state_dict(model.state_dict())
    for block in reference.h:
        with torch.no_grad():
            block.attn.c_proj.weight.zero_()
    assert_close(outputs(again, ids), outputs(reference, ids), find_heads(reference))


def test_partial_factory_prune_matches_gated_and_keeps_heads(tmp_path, monkeypatch):
    monkeypatch.delenv("NANO_HEADS", raising=False)
    _lm_files(tmp_path)
    res = CliRunner().invoke(cli, ["prune", str(tmp_path / "nano.pt"), "--factory", FACTORY, "--data",
                                   str(tmp_path / "data.pt"), "--max-loss", "100", "--limit", "3",
                                   "--candidates", "2", "--json", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output
    d = json.loads((tmp_path / "p.json").read_text())
    assert d["n_removed"] == 3 and sum(d["heads_left"]) == 5 and d["verify"]["passed"]
    assert d["size"]["parameters_after"] < d["size"]["parameters_before"]
    html = tmp_path / "r.html"
    rep = CliRunner().invoke(cli, ["report", str(tmp_path / "p.json"), "-o", str(html)])
    assert rep.exit_code == 0, rep.output
    text = html.read_text()
    assert 'id="prune"' in text and "Removal order" in text and "data:image/svg+xml;base64," in text


def _checkpoint(tmp_path):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(kind="classifier", n_layers=1, n_heads=2, d_model=16, vocab_size=20))
    save_checkpoint(model, tmp_path / "m.pt")
    ids = torch.randint(1, 20, (8, 6))
    torch.save({"input_ids": ids}, tmp_path / "nolabels.pt")
    torch.save({"input_ids": ids, "labels": torch.zeros(8, dtype=torch.long)}, tmp_path / "labels.pt")


def _bad(args):
    res = CliRunner().invoke(cli, ["prune", *args])
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), res.output
    return lines[0]


def test_bad_inputs_one_line_exit_2_nothing_written(tmp_path):
    _checkpoint(tmp_path)
    before = digest(tmp_path)
    m, labels = str(tmp_path / "m.pt"), str(tmp_path / "labels.pt")
    assert "no labels" in _bad([m, "--data", str(tmp_path / "nolabels.pt"), "--task", "classification"])
    assert "--max-drop" in _bad([m, "--data", labels, "--max-drop", "-1"])
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep me")
    assert "not empty" in _bad([m, "--data", labels, "--out", str(full)])
    assert digest(tmp_path) != before  # only the folder made above
    (full / "x").unlink()
    full.rmdir()
    assert digest(tmp_path) == before


def test_a_family_that_cannot_be_cut_is_refused(tmp_path):
    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(20, 16)
            layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.enc = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
            self.head = torch.nn.Linear(16, 2)

        def forward(self, input_ids):
            return self.head(self.enc(self.emb(input_ids)).mean(1))

    import diagnose
    from diagnose.errors import ConfigError

    ids = torch.randint(1, 20, (8, 6))
    try:
        diagnose.prune_heads(Encoder().eval(), {"input_ids": ids, "labels": torch.zeros(8, dtype=torch.long)})
    except ConfigError as exc:
        assert "cannot be cut" in str(exc) and "\n" not in str(exc)
    else:
        raise AssertionError("a torch MultiheadAttention model was cut")
    assert not os.environ.get("NANO_HEADS")


def test_the_cli_choices_are_the_library_s():
    from diagnose.ablation.methods import FOLDABLE
    from diagnose.cli import prune
    from diagnose.objectives import TASKS

    assert prune.METHODS == FOLDABLE and "resample" not in FOLDABLE  # prune offers what a cut model reproduces and prune.TASKS == TASKS
