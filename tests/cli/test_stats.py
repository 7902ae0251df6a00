"""`diagnose stats`: summary, --json, --tensorboard, --follow, and bad folders."""

from __future__ import annotations

import json
import math
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from diagnose import _json
from diagnose.cli.main import cli
from diagnose.monitor import TrainingMonitor, read_run
from diagnose.monitor._runfolder import RunWriter
from diagnose.zoo import ModelConfig, Transformer
from ..tolerance import F64, approx

pytestmark = pytest.mark.numerics


def _train(run_dir, steps=6, nan_at=None, delay=0.0):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, n_heads=2, d_model=16, max_len=8, vocab_size=11))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(1, 11, (4, 8))  # [B, T]
    with TrainingMonitor(model, run_dir, attention_every=2, every=1, echo=False) as mon:
        for s in range(steps):
            loss = F.cross_entropy(model(ids)[:, :-1].reshape(-1, 11), ids[:, 1:].reshape(-1))
            if s == nan_at:
                loss = loss * float("nan")
            loss.backward()
            mon.step(loss, optimizer=opt)
            opt.step()
            opt.zero_grad()
            time.sleep(delay)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    _train(d, nan_at=4)
    return d


def test_summary_tables_and_alert_with_hint(run_dir):
    result = CliRunner().invoke(cli, ["stats", str(run_dir)], terminal_width=200, env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    out = result.output
    for text in ("steps 0..5 (6 logged)", "blocks.0", "blocks.1", "blocks.1.attn", "step 4 nonfinite", "hint:"):
        assert text in out, text


def test_json_matches_the_run(run_dir):
    result = CliRunner().invoke(cli, ["stats", str(run_dir), "--json"])
    assert result.exit_code == 0, result.output
    strict = json.loads(result.output, parse_constant=lambda c: pytest.fail(f"bare {c} in strict JSON"))
    assert strict["final_loss"] is None and strict["nonfinite"]["/final_loss"] == "NaN"  # the one encoding
    s = _json.loads(result.output)
    run = read_run(run_dir)
    assert s["schema"] == "diagnose.run-summary/1" and s["steps_logged"] == 6 and s["closed"]
    assert math.isnan(s["final_loss"])  # a NaN at the end is shown, not replaced by an older value
    assert [r["name"] for r in s["layers"]] == ["blocks.0", "blocks.1"]
    last = run.steps["layers/blocks.0/act_var"].iloc[-1]
    assert s["layers"][0]["act_var"] == last or (math.isnan(s["layers"][0]["act_var"]) and math.isnan(last))
    assert s["attention"][0]["step"] == 4 and len(s["attention"][0]["entropy"]) == 2
    assert [a["kind"] for a in s["alerts"]] == ["no_warmup", "nonfinite"]  # constant lr from step 0


def test_tensorboard_export_reads_back(run_dir, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = CliRunner().invoke(cli, ["stats", str(run_dir), "--tensorboard", str(tmp_path / "tb")])
    assert result.exit_code == 0, result.output
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"loss", "grad_norm", "layers/blocks.1/act_var", "attention/blocks.0.attn/entropy/head1"} <= set(tags)
    run = read_run(run_dir)
    got = [e.value for e in acc.Scalars("grad_norm")]
    assert got[:4] == approx(run.steps["grad_norm"].tolist()[:4])  # TensorBoard stores scalars as float32


def test_follow_tails_until_closed(tmp_path):
    d = tmp_path / "live"
    t = threading.Thread(target=_train, args=(d,), kwargs={"steps": 5, "delay": 0.3})
    t.start()
    try:
        result = CliRunner().invoke(cli, ["stats", str(d), "--follow"])
    finally:
        t.join()
    assert result.exit_code == 0, result.output
    assert [line.split()[1] for line in result.output.splitlines() if " loss " in line][:5] == list("01234")
    assert "steps 0..4 (5 logged)" in result.output


@pytest.mark.parametrize("setup, message", [
    (lambda p: None, "no run.json"),
    (lambda p: RunWriter(p, {"settings": {}}).close(), "holds no logged steps"),
])
def test_bad_folder_is_one_line_exit_2(tmp_path, setup, message):
    setup(tmp_path)
    result = CliRunner().invoke(cli, ["stats", str(tmp_path)])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_html_shortcut_writes_the_report(run_dir, tmp_path):
    out = tmp_path / "run.html"
    result = CliRunner().invoke(cli, ["stats", str(run_dir), "--html", str(out)])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>") and 'id="training"' in html and "nonfinite" in html
