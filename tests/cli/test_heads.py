"""`diagnose heads` end to end on saved files, and every bad input: exit code 2, one line on
stderr, nothing written."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from click.testing import CliRunner

import diagnose
from diagnose.cli.main import cli
from diagnose.zoo import ModelConfig, Transformer

from .test_files import FACTORY_SRC  # the same tiny user model, written once
from ..tolerance import loss_tol

pytestmark = pytest.mark.numerics


def _run(*args):
    return CliRunner().invoke(cli, ["heads", *map(str, args)])


def _assert_clean_error(result, *words):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    lm = Transformer(ModelConfig(kind="lm", vocab_size=12, max_len=8, n_layers=2, n_heads=2, d_model=16, init_std=0.3))
    diagnose.save_checkpoint(lm, tmp_path / "lm.pt", meta={"task": "lm"})
    clf = Transformer(ModelConfig(kind="classifier", vocab_size=12, n_classes=3, max_len=8, n_layers=1, n_heads=2,
                                  d_model=16, init_std=0.3))
    diagnose.save_checkpoint(clf, tmp_path / "clf.pt")
    ids = torch.randint(1, 12, (20, 6))  # [N, T]
    mask = torch.ones(20, 6, dtype=torch.long)
    mask[::2, 4:] = 0
    torch.save({"input_ids": ids, "attention_mask": mask}, tmp_path / "lm_data.pt")
    torch.save({"input_ids": ids, "attention_mask": mask, "labels": torch.arange(20) % 3}, tmp_path / "cls.pt")
    torch.save({"input_ids": ids, "labels": torch.arange(20) % 7}, tmp_path / "bad_labels.pt")
    return tmp_path


def test_lm_checkpoint_table_and_json(files):
    result = _run("lm.pt", "--data", "lm_data.pt", "--json", "out/heads.json", "--batch-size", "8")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "reference model, 2 layers; lm, zero ablation, 20 examples" in out
    for name in ("L0.H0", "L0.H1", "L1.H0", "L1.H1"):
        assert name in out
    assert "heads tested matter" in out and "after Holm correction" in out
    data = json.loads((files / "out" / "heads.json").read_text())
    assert data["schema"] == "diagnose.heads/2" and data["task"] == "lm" and data["n_examples"] == 20
    assert len(data["heads"]) == 4 and data["model"]["family"] == "reference"
    assert data["significance"]["min_detectable_examples"] == 8  # 4 heads, alpha 0.05: 2 * 0.5 ** 8 < 0.05 / 4 < 2 * 0.5 ** 7
    assert "examples change one way" in " ".join(out.split())
    assert list(files.joinpath("out").iterdir()) == [files / "out" / "heads.json"]  # no temporary left


def test_benjamini_hochberg_and_the_negligible_band(files):
    result = _run("lm.pt", "--data", "lm_data.pt", "--correction", "bh", "--min-effect", "0.2", "--json", "bh.json")
    assert result.exit_code == 0, result.output
    data = json.loads((files / "bh.json").read_text())
    assert data["significance"]["correction"] == "bh" and data["significance"]["drives"] == "delta_loss"
    assert data["significance"]["negligible_band"]["min_effect"] == 0.2 and "after BH correction" in result.stdout
    for h in data["heads"]:
        assert h["significant"] == (h["p_value_loss_adjusted"] < 0.05) and h["role"] and len(h["delta_loss_ci"]) == 2
    bad = _run("lm.pt", "--data", "lm_data.pt", "--correction", "bonferroni")
    assert bad.exit_code == 2 and "bonferroni" in bad.output


def test_classifier_default_task_mean_and_fast(files):
    result = _run("clf.pt", "--data", "cls.pt", "--method", "mean", "--json", "h.json")
    assert result.exit_code == 0, result.output
    data = json.loads((files / "h.json").read_text())
    assert data["task"] == "classification" and data["method"] == "mean" and data["n_units"] == 20
    result = _run("clf.pt", "--data", "cls.pt", "--fast", "--top", "1", "--json", "f.json")
    assert result.exit_code == 0, result.output
    fast = json.loads((files / "f.json").read_text())
    assert sum(h["verified"] for h in fast["heads"]) == 1 and "not verified" in result.stdout


def test_together_closes_groups_and_matches_the_library(files):
    result = _run("lm.pt", "--data", "lm_data.pt", "--together", "L0.H1,L1.H0", "--together", "1.1",
                  "--json", "t.json", "--html", "t.html")
    assert result.exit_code == 0, result.output
    data = json.loads((files / "t.json").read_text())
    assert [g["heads"] for g in data["together"]] == [[[0, 1], [1, 0]], [[1, 1]]]
    single = next(h for h in data["heads"] if (h["layer"], h["head"]) == (1, 1))
    assert data["together"][1]["delta_loss"] == pytest.approx(single["delta_loss"], abs=loss_tol(single["loss"], depth=2, width=16))  # float32 sums
    assert "Closed together L0.H1 + L1.H0: accuracy" in result.stdout
    html = (files / "t.html").read_text()
    assert "Heads closed together" in html and "L0.H1 + L1.H0" in html
    for bad, says in (("L0.H9", "no head 9 in layer 0"), ("cat", "L<layer>.H<head>"), (",", "names no head")):
        _assert_clean_error(_run("lm.pt", "--data", "lm_data.pt", "--together", bad, "--json", "x.json"), says)
    assert not (files / "x.json").exists()


def test_help_has_an_example():
    result = CliRunner().invoke(cli, ["heads", "--help"])
    assert result.exit_code == 0
    assert "Example: diagnose heads" in result.output and "--fast" in result.output and "--method" in result.output


def test_bad_inputs_exit_2_with_one_line_and_write_nothing(files, monkeypatch):
    _assert_clean_error(_run("missing.pt", "--data", "lm_data.pt", "--json", "x.json"), "missing.pt")
    _assert_clean_error(_run("clf.pt", "--data", "nothing.pt", "--json", "x.json"), "nothing.pt")
    _assert_clean_error(_run("clf.pt", "--data", "bad_labels.pt", "--json", "x.json"), "bad_labels.pt")
    _assert_clean_error(_run("clf.pt", "--data", "lm_data.pt", "--task", "classification", "--json", "x.json"),
                        "labels")
    # a model without attention: the message says how to name the layers
    monkeypatch.syspath_prepend(str(files))
    (files / "bagfactory.py").write_text(FACTORY_SRC)
    torch.save(__import__("bagfactory").build().state_dict(), files / "bag.pt")
    try:
        _assert_clean_error(_run("bag.pt", "--factory", "bagfactory:build", "--data", "cls.pt", "--json", "x.json"),
                            "--attention-module")
    finally:
        sys.modules.pop("bagfactory", None)
    assert not (files / "x.json").exists()
    assert not list(files.glob("*.partial")) and not list(files.glob(".*partial"))
    assert _run("lm.pt", "--data", "lm_data.pt", "--method", "nonesuch").exit_code == 2  # resample is a method now
    _assert_clean_error(_run("lm.pt", "--data", "lm_data.pt", "--method", "zero", "--draws", "2"), "draws")
    _assert_clean_error(_run("lm.pt", "--data", "lm_data.pt", "--methods", "zero"), "--methods")
    _assert_clean_error(_run("lm.pt", "--data", "lm_data.pt", "--methods", "zero,nope"), "nope")


def test_hf_folder_with_text_data_keeps_token_strings(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "the", "cat", "sat", "dog"])}
    tk = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]")
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=6, hidden_size=8, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=8,
                                                     max_position_embeddings=16, num_labels=2))
    model.save_pretrained(tmp_path / "bert")
    tok.save_pretrained(tmp_path / "bert")
    (tmp_path / "d.jsonl").write_text('{"text": "the cat sat", "label": 1}\n{"text": "dog", "label": 0}\n'
                                      '{"text": "the dog sat", "label": 0}\n')
    result = _run(tmp_path / "bert", "--data", tmp_path / "d.jsonl", "--json", tmp_path / "h.json")
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "h.json").read_text())
    assert data["task"] == "classification" and data["model"]["family"].startswith("hf")
    assert data["examples"][0]["tokens"] == ["the", "cat", "sat"] and data["examples"][1]["tokens"] == ["dog"]
    assert len(data["examples"][1]["attention"][0][0]) == 1  # padding trimmed: a 1 x 1 map per head


def test_html_shortcut_writes_the_report(files):
    result = _run("lm.pt", "--data", "lm_data.pt", "--html", "out/heads.html", "--batch-size", "8")
    assert result.exit_code == 0, result.output
    html = (files / "out" / "heads.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and 'id="heads"' in html and "http://" not in html
