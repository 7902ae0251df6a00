"""`diagnose check` through click: findings printed with evidence and fix, exit codes, JSON, bad input."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from diagnose import save_checkpoint
from diagnose.cli.main import cli
from diagnose.zoo import ModelConfig, Transformer, padded_majority

pytestmark = pytest.mark.numerics


def _run(*args):
    return CliRunner().invoke(cli, ["check", *map(str, args)])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("check")
    torch.manual_seed(0)
    save_checkpoint(Transformer(ModelConfig(kind="lm")), d / "good.pt")
    save_checkpoint(Transformer(ModelConfig(kind="classifier", vocab_size=8, mask_fill="zero", positions="none")),
                    d / "bad.pt")
    save_checkpoint(Transformer(ModelConfig(kind="lm", causal=False)), d / "encoder.pt")
    torch.save(padded_majority(n=32, max_len=12).tensors(), d / "data.pt")
    torch.save({"input_ids": torch.full((4, 8), 50)}, d / "out_of_vocab.pt")
    return d


def test_clean_model_prints_what_passed(files):
    res = _run(files / "good.pt", "--strict")
    assert res.exit_code == 0, res.output
    assert "No wiring problem found." in res.output
    assert "passed: causal, padding, scaling, positions" in res.output


def test_findings_print_evidence_and_fix_and_exit_0_unless_strict(files, tmp_path):
    out = tmp_path / "checks.json"
    res = _run(files / "bad.pt", "--data", files / "data.pt", "--json", out)
    assert res.exit_code == 0, res.output
    assert "ERROR" in res.output and "padding: Padding leak" in res.output
    assert "WARNING" in res.output and "positions: No positional information" in res.output
    assert "max_relative_change_content_right = " in res.output and "fix: " in res.output
    assert "2 problem(s) found." in res.output and "skipped: causal" in res.output
    data = json.loads(out.read_text())
    assert data["schema"] == "diagnose.checks/1" and data["model"]["probe"]["data"] == "given"
    assert sorted(f["check"] for f in data["findings"]) == ["padding", "positions"]
    assert _run(files / "bad.pt", "--strict").exit_code == 1


def test_causal_flag_turns_a_bidirectional_lm_into_an_error(files):
    res = _run(files / "encoder.pt")
    assert res.exit_code == 0 and "INFO" in res.output and "No wiring problem found." in res.output
    res = _run(files / "encoder.pt", "--causal", "--strict")
    assert res.exit_code == 1 and "ERROR" in res.output and "Causal leak" in res.output
    for flag in ("--bidirectional", "--no-causal"):
        res = _run(files / "encoder.pt", flag)
        assert "skipped: causal (causal=False" in res.output


def test_hf_folder(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=60,
                                  bos_token_id=1, eos_token_id=2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2")
    res = _run(tmp_path / "gpt2", "--strict")
    assert res.exit_code == 0, res.output
    assert "GPT2LMHeadModel" in res.output and "passed: causal, padding, scaling, positions" in res.output


@pytest.mark.parametrize("case", ["missing", "out_of_vocab", "not_a_run"])
def test_bad_input_is_one_line_and_exit_2(files, tmp_path, case):
    args = {"missing": [tmp_path / "nope.pt"],
            "out_of_vocab": [files / "good.pt", "--data", files / "out_of_vocab.pt"],
            "not_a_run": [files / "good.pt", "--run", tmp_path]}[case]
    out = tmp_path / "never.json"
    res = _run(*args, "--json", out)
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output
    assert not out.exists()


def test_run_folder_adds_warmup_and_clipping(files, tmp_path):
    from diagnose import TrainingMonitor
    from diagnose.zoo import TrainConfig, make_optimizer

    model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2))
    opt, sched = make_optimizer(model, TrainConfig(warmup=0, steps=10))
    ids = torch.randint(1, 32, (4, 8))  # [B, T]
    with TrainingMonitor(model, tmp_path / "run", attention_every=0, clip=1.0, every=1, echo=False) as mon:
        for _ in range(4):
            loss = model(ids).logsumexp(-1).mean()
            opt.zero_grad()
            loss.backward()
            mon.step(loss, optimizer=opt)
            opt.step()
            sched.step()
    res = _run(files / "good.pt", "--run", tmp_path / "run")
    assert res.exit_code == 0, res.output
    assert "warmup: No learning-rate warmup" in res.output
    assert "passed: causal, padding, scaling, positions, grad_clipping" in res.output
