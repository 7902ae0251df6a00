"""Actions on a planted spike (issue 33): skip_on drops the update and keeps the optimizer's state,
stop_on writes the steps to skip, and a spike between logged steps is still caught (the light step)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.errors import ConfigError, TrainingAlertError
from diagnose.monitor import TrainingMonitor, read_run
from diagnose.zoo import ModelConfig, Transformer
from ..tolerance import assert_differ, assert_exact

pytestmark = pytest.mark.numerics

SPIKE = 15  # a step the default every=10 does not log


def _model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(n_layers=2, n_heads=2, d_model=16, max_len=8, vocab_size=11))


def _train(model, steps, mon=None, skip_at=None):
    """AdamW on one fixed batch; the loss at SPIKE is multiplied by 30 (its gradient too). Returns the
    optimizer. skip_at: the step whose optimizer.step() this loop leaves out by hand (the reference)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(1, 11, (8, 8), generator=torch.Generator().manual_seed(1))  # [B, T]
    for s in range(steps):
        logits = model(ids)  # [B, T, V]
        loss = F.cross_entropy(logits.reshape(-1, 11), ids.reshape(-1)) * (30.0 if s == SPIKE else 1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if mon is not None:
            mon.step(loss, optimizer=opt, batch={"input_ids": ids})
        if s != skip_at:
            opt.step()
    return opt


def test_skip_on_drops_the_planted_spike_as_leaving_out_its_step_would(tmp_path):
    model = _model()
    with TrainingMonitor(model, tmp_path, echo=False, skip_on=("loss_spike", "grad_spike"),
                         save_spikes=True) as mon:
        opt = _train(model, SPIKE + 2, mon)
    reference = _model()
    ref_opt = _train(reference, SPIKE + 2, skip_at=SPIKE)  # the same loop, that step's update left out by hand
    for p, q in zip(model.parameters(), reference.parameters()):
        assert_exact(p, q)  # the weights, and below Adam's moments and step count: the state kept
    for p, q in zip(opt.param_groups[0]["params"], ref_opt.param_groups[0]["params"]):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert_exact(opt.state[p][key], ref_opt.state[q][key])
    assert mon.skips == [SPIKE]
    skips = json.loads((tmp_path / "skips.json").read_text())  # strict JSON
    assert skips["format"] == "diagnose.skips/1"
    assert skips["steps"] == [{"step": SPIKE, "kinds": ["grad_spike", "loss_spike"], "action": "skipped",
                               "batch": "step_00000015"}]
    run = read_run(tmp_path)
    assert SPIKE not in run.steps["step"].tolist()  # a light step: no record, yet alerted and its batch saved
    assert {a["kind"] for a in run.alerts if a["step"] == SPIKE} == {"grad_spike", "loss_spike"}
    assert [s["step"] for s in run.spikes] == [SPIKE]
    out = CliRunner().invoke(cli, ["stats", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert f"step {SPIKE} skipped on grad_spike, loss_spike, batch spikes/step_00000015" in out.output


def test_without_skip_on_the_spike_is_applied(tmp_path):
    model = _model()
    with TrainingMonitor(model, tmp_path, echo=False) as mon:
        _train(model, SPIKE + 2, mon)
    reference = _model()
    _train(reference, SPIKE + 2, skip_at=SPIKE)
    flat = [torch.cat([p.detach().flatten() for p in m.parameters()]) for m in (model, reference)]
    assert_differ(*flat)  # the spike's update moved the weights: the test above can fail
    assert mon.skips == [] and not (tmp_path / "skips.json").exists()


def test_stop_on_writes_the_step_to_skip_and_raises(tmp_path):
    model = _model()
    with TrainingMonitor(model, tmp_path, echo=False, stop_on=("loss_spike",)) as mon:
        with pytest.raises(TrainingAlertError, match=f"step {SPIKE}: loss_spike"):
            _train(model, SPIKE + 2, mon)
    skips = json.loads((tmp_path / "skips.json").read_text())
    assert skips["steps"] == [{"step": SPIKE, "kinds": ["loss_spike"], "action": "stopped", "batch": None}]


def test_skip_on_takes_only_kinds_judged_on_every_step(tmp_path):
    with pytest.raises(ConfigError, match="entropy_collapse"):
        TrainingMonitor(_model(), tmp_path, skip_on=("entropy_collapse",))
