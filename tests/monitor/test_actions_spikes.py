"""Throughput fields, log_eval, alert actions (raise_on, on_alert, the callbacks' stop_on) and
spike forensics (the batch behind a spike alert saved to spikes/, capped in bytes)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from diagnose.errors import TrainingAlertError
from diagnose.monitor import TrainingMonitor, read_run
from diagnose.zoo import ModelConfig, Transformer
from ..tolerance import F64, approx

pytestmark = pytest.mark.numerics


def _model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(n_layers=2, n_heads=2, d_model=16, max_len=8, vocab_size=11))


def _ids(B=8, T=8):
    return torch.randint(1, 11, (B, T), generator=torch.Generator().manual_seed(1))  # [B, T]


def _losses(model, ids):
    logits = model(ids)[:, :-1]  # [B, T-1, V]
    return F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none").mean(1)  # [B]


def _train(mon, model, steps, nan_at=None, ids=None, accum=1):
    ids = _ids() if ids is None else ids
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    given = []  # the per-example losses handed to step(), per step
    for s in range(steps):
        per = []
        for _ in range(accum):
            ex = _losses(model, ids)
            loss = ex.mean() * (float("nan") if s == nan_at else 1.0)
            (loss / accum).backward()
            per.append(ex.detach())
        given.append(torch.cat(per))
        mon.step(loss, optimizer=opt, batch={"input_ids": ids, "labels": ids}, per_example_loss=given[-1])
        opt.step()
        opt.zero_grad()
    return given


def test_throughput_fields(tmp_path):
    model = _model()
    with TrainingMonitor(model, tmp_path, every=2, echo=False) as mon:
        _train(mon, model, 6, accum=3)
    run = read_run(tmp_path)
    rec = run.records
    assert [r["step"] for r in rec] == [0, 2, 4]
    assert rec[0]["step_time"] is None and rec[0]["tokens_per_s"] is None  # no earlier step to time from
    # no check against the wall clock (step times belong to bench/bench_monitor.py): a step time is
    # positive, and tokens/s is what it says it is
    for r in rec[1:]:
        assert r["micro_batches"] == 3 and r["tokens"] == 3 * 8 * 8 and r["step_time"] > 0
        assert r["tokens_per_s"] == approx(r["tokens"] / r["step_time"], dtype=F64)
    assert {"step_time", "tokens", "tokens_per_s", "micro_batches"} <= set(run.steps.columns)


def test_explicit_tokens_and_micro_batches(tmp_path):
    model = _model()
    ids = _ids()
    with TrainingMonitor(model, tmp_path, every=1, echo=False) as mon:
        for _ in range(2):
            _losses(model, ids).mean().backward()
            rec = mon.step(1.0, tokens=torch.tensor(50), micro_batches=2)
    assert rec["tokens"] == 50 and rec["micro_batches"] == 2 and rec["tokens_per_s"] > 0


def test_log_eval_reads_back(tmp_path):
    model = _model()
    with TrainingMonitor(model, tmp_path, every=1, echo=False) as mon:
        _train(mon, model, 2)
        mon.log_eval(1, loss=torch.tensor(2.5), accuracy=0.25)
        mon.log_eval(2, loss=None, accuracy=0.5, perplexity=float("nan"))
        with pytest.raises(TypeError, match="accuracy"):
            mon.log_eval(3, accuracy="high")
    lines = (tmp_path / "evals.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]  # strict JSON (the NaN is null + named)
    ev = read_run(tmp_path).evals
    assert ev["step"].tolist() == [1, 2] and ev["loss"].iloc[0] == 2.5 and math.isnan(ev["loss"].iloc[1])
    assert ev["accuracy"].tolist() == [0.25, 0.5] and math.isnan(ev["perplexity"].iloc[1])


def test_no_evals_is_an_empty_frame(tmp_path):
    model = _model()
    with TrainingMonitor(model, tmp_path, every=1, echo=False) as mon:
        _train(mon, model, 1)
    run = read_run(tmp_path)
    assert run.evals.empty and list(run.evals.columns) == ["step", "time", "loss"] and run.spikes == []


def test_raise_on_and_on_alert(tmp_path):
    model = _model()
    seen = []
    with TrainingMonitor(model, tmp_path, every=1, echo=False, raise_on=("nonfinite",), on_alert=seen.append) as mon:
        with pytest.raises(TrainingAlertError, match="step 3: nonfinite") as info:
            _train(mon, model, 6, nan_at=3)
    assert [a["kind"] for a in info.value.alerts] == ["nonfinite"]
    run = read_run(tmp_path)
    assert seen == run.alerts and run.alerts[-1] == info.value.alerts[0]  # every alert, in order; nonfinite last
    assert run.steps["step"].tolist() == [0, 1, 2, 3]  # the step that raised is written first


def test_spike_batch_saved_and_capped(tmp_path):
    model = _model()
    ids = _ids()  # [8, 8] int64: 512 bytes per tensor, 64 per example
    with TrainingMonitor(model, tmp_path, every=1, echo=False, save_spikes=True, spike_bytes=300) as mon:
        given = _train(mon, model, 5, nan_at=3, ids=ids)
    run = read_run(tmp_path)
    (spike,) = run.spikes
    assert spike["step"] == 3 and spike["kinds"] == ["nonfinite"] and spike["truncated"] is True
    # per example: 64 + 64 bytes of ids and labels, 4 of loss -> 2 examples fit in 300 bytes
    assert spike["tensors"]["input_ids"] == {"shape": [2, 8], "dtype": "int64"}
    assert spike["bytes"] == 2 * (64 + 64 + 4) <= 300 and "first 2 of 8" in spike["note"]
    saved = load_file(str(tmp_path / "spikes" / "step_00000003.safetensors"))
    assert torch.equal(saved["input_ids"], ids[:2]) and torch.equal(saved["labels"], ids[:2])
    assert torch.equal(saved["per_example_loss"], given[3][:2])
    json.loads((tmp_path / "spikes" / "step_00000003.json").read_text())


def test_spikes_off_by_default_and_limited(tmp_path):
    model = _model()
    with TrainingMonitor(model, tmp_path / "off", every=1, echo=False) as mon:
        _train(mon, model, 5, nan_at=3)
    assert not (tmp_path / "off" / "spikes").exists()
    with TrainingMonitor(model, tmp_path / "none", every=1, echo=False, save_spikes=True, spike_limit=0) as mon:
        _train(mon, _model(), 5, nan_at=3)
    assert read_run(tmp_path / "none").spikes == []


def test_whole_batch_when_it_fits(tmp_path):
    model = _model()
    with TrainingMonitor(model, tmp_path, every=1, echo=False, save_spikes=True) as mon:
        _train(mon, model, 5, nan_at=2)
    (spike,) = read_run(tmp_path).spikes
    assert spike["truncated"] is False and spike["tensors"]["per_example_loss"]["shape"] == [8]


def test_a_spike_that_cannot_be_written_warns_and_training_goes_on(tmp_path):
    model = _model()
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "spikes").write_text("a file where the folder should be")
    with TrainingMonitor(model, tmp_path, every=1, echo=False, save_spikes=True) as mon:
        with pytest.warns(RuntimeWarning, match="spike batch at step 2 not saved"):
            _train(mon, model, 4, nan_at=2)
    assert read_run(tmp_path).steps["step"].tolist() == [0, 1, 2, 3]
