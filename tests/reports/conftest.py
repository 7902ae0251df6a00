"""Report fixtures: schema-valid heads JSON, run folders and checks JSON built by
report_fixtures (importable from this folder), and one full report shared by a module."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import report_fixtures as rf  # noqa: E402

TOKENS = rf.HOSTILE_TOKENS


@pytest.fixture(scope="session")
def inputs(tmp_path_factory):
    """(heads.json, run folder, checks.json) with an XSS token, alerts and a NaN stretch."""
    d = tmp_path_factory.mktemp("demo", numbered=False)  # labels read demo/heads, demo/exp1
    heads = rf.write_heads(d / "heads.json", tokens=TOKENS, n_layers=2, n_heads=4)
    run = rf.write_run(d / "exp1", steps=300, alerts=[
        rf.alert(40), rf.alert(45),
        rf.alert(200, kind="nonfinite", severity="error", where="blocks.0", message="loss is NaN",
                 hint="lower the learning rate; check for log(0)")], nan_from=200)
    checks = d / "checks.json"
    checks.write_text(json.dumps(rf.make_checks()))
    return heads, run, checks


@pytest.fixture(scope="session")
def report_file(inputs, tmp_path_factory):
    from diagnose.reports import write_report

    return write_report(list(inputs), tmp_path_factory.mktemp("out") / "report.html")


@pytest.fixture(scope="session")
def real(tmp_path_factory):
    """A monitored training run, an ablation sweep and the checks of one small reference model,
    as objects (result, findings) and as files in the returned folder."""
    from diagnose import TrainingMonitor, check_model
    from diagnose.ablation import ablate_heads
    from diagnose.zoo import ModelConfig, TrainConfig, Transformer, induction, train

    d = tmp_path_factory.mktemp("real")
    train_d, eval_d = induction(n=320, length=12, vocab_size=16).split(256)
    model = Transformer(ModelConfig(kind="lm", vocab_size=16, max_len=16, n_layers=2, n_heads=2, d_model=32))
    with TrainingMonitor(model, d / "run", attention_every=5, every=1, echo=False) as mon:
        train(model, train_d, TrainConfig(steps=40, batch_size=32, warmup=5),
              on_backward=lambda step, loss, opt: mon.step(loss, optimizer=opt))
    result = ablate_heads(model, eval_d, task="lm", progress=False, keep=2)
    findings = check_model(model, eval_d)
    result.save(d / "heads.json")
    findings.write_json(d / "checks.json")
    return d, result, findings


@pytest.fixture(scope="session")
def real_report(real, planted_circuit):
    from diagnose.reports import write_report

    d, result, findings = real
    return write_report([result, d / "run", findings, planted_circuit], d / "report.html")


@pytest.fixture(scope="session")
def planted_circuit():
    """The circuit of the hand-wired induction model (tests/circuit/planted.py): two edges, K and direct."""
    from diagnose import find_circuit

    from ..circuit.planted import planted, planted_data

    return find_circuit(planted("induction"), planted_data("induction", n=12), task="lm", resamples=2, n_boot=200)
