"""The monitor's plug-in points: a toy measurement, a toy alert kind and a toy sink, each added
from outside the package, reach the record, the run folder, `diagnose stats --json` and the
alerts; and the monitor's user mistakes are DiagnoseErrors that callers of the built-ins still catch."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose import _json
from diagnose.errors import ConfigError, DiagnoseError, StateError, UsageError
from diagnose.monitor import (Detector, Measurement, Sink, Thresholds, TrainingMonitor, read_run, register_detector,
                              register_measurement, unregister_detector, unregister_measurement)
from diagnose.monitor._layout import StepLayout
from diagnose.zoo import ModelConfig, Transformer

pytestmark = pytest.mark.numerics


def _model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(n_layers=2, n_heads=2, d_model=16, max_len=8, vocab_size=11))


def _train(mon, model, steps=4, lr=0.1):
    ids = torch.randint(1, 11, (4, 8), generator=torch.Generator().manual_seed(1))  # [B, T]
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for s in range(steps):
        logits = model(ids)[:, :-1]  # [B, T-1, V]
        loss = F.cross_entropy(logits.reshape(-1, 11), ids[:, 1:].reshape(-1))
        loss.backward()
        mon.step(loss, optimizer=opt)
        if s == 1:
            mon.log_eval(s, loss=loss.item(), accuracy=0.5)
        opt.step()
        opt.zero_grad()


class _WeightNorms:
    """A toy per-layer measurement: each block's weight norm, with no hooks (the shape of issue
    22's update-to-weight ratio: one number per layer, read at step())."""

    def __init__(self, monitor):
        self.blocks = [m for _, m in monitor.blocks]
        self.names = monitor.block_names

    def arm(self, step, logged, sampled):
        pass

    def discard(self):
        pass

    def collect(self, inputs):
        return torch.stack([torch.cat([p.detach().flatten() for p in b.parameters()]).norm() for b in self.blocks])[:, None]

    def write(self, record, units):
        for name, unit in zip(self.names, units):
            record["layers"][name]["weight_norm"] = unit["norm"][0]

    def remove(self):
        pass


WEIGHT_NORM = Measurement("weight_norm", ("norm",), "layer", ("layers.*.weight_norm",), _WeightNorms,
                          reduce={"norm": "max"})


class _BigWeights(Detector):
    """A toy alert kind on the toy measurement, with a threshold of its own."""

    kind, severity, hint = "big_weights", "warning", "toy hint: shrink the weights"
    defaults = {"weight_norm_max": 1e9}

    def check(self, rec, ctx, emit):
        big = [(n, st["weight_norm"]) for n, st in rec["layers"].items()
               if st.get("weight_norm", 0.0) > ctx.threshold("weight_norm_max")]
        emit(bool(big), big[0][0] if big else "", f"weight norm {big[0][1]:.3g}" if big else "")


@pytest.fixture
def plugins():
    register_measurement(WEIGHT_NORM)
    register_detector(_BigWeights)
    try:
        yield
    finally:
        unregister_measurement("weight_norm")
        unregister_detector("big_weights")


def test_a_registered_measurement_reaches_the_record_the_run_and_stats_json(tmp_path, plugins):
    model = _model()
    with TrainingMonitor(model, tmp_path / "run", every=1, echo=False, attention_every=2) as mon:
        _train(mon, model, lr=0.0)  # the weights stay as they are: the norms below are the ones measured
    run = read_run(tmp_path / "run")
    want = [torch.cat([p.detach().flatten() for p in b.parameters()]).norm().item() for b in model.blocks]
    last = run.records[-1]["layers"]
    assert [last[f"blocks.{i}"]["weight_norm"] for i in range(2)] == want  # the same float32 norms, widened
    assert {"layers/blocks.0/weight_norm", "layers/blocks.1/weight_norm"} <= set(run.steps.columns)
    assert list(last["blocks.0"])[-1] == "weight_norm"  # after the built-in fields, which keep their order
    out = CliRunner().invoke(cli, ["stats", str(tmp_path / "run"), "--json"])
    assert out.exit_code == 0, out.output
    layers = json.loads(out.output)["layers"]
    assert [row["weight_norm"] for row in layers] == want  # JSON round-trips a float exactly


def test_a_registered_detector_fires_with_its_own_threshold_and_hint(tmp_path, plugins):
    model = _model()
    with TrainingMonitor(model, tmp_path / "run", every=1, echo=False,
                         thresholds=Thresholds(extra={"weight_norm_max": 0.0})) as mon:
        _train(mon, model)
    alerts = [a for a in read_run(tmp_path / "run").alerts if a["kind"] == "big_weights"]
    assert [(a["step"], a["where"], a["hint"]) for a in alerts] == [(0, "blocks.0", "toy hint: shrink the weights")]
    quiet = tmp_path / "quiet"
    with TrainingMonitor(_model(), quiet, every=1, echo=False) as mon:  # the detector's default: never
        _train(mon, mon.model)
    assert [a for a in read_run(quiet).alerts if a["kind"] == "big_weights"] == []


def test_a_threshold_no_detector_reads_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="weight_norm_max"):
        TrainingMonitor(_model(), tmp_path / "run", thresholds=Thresholds(extra={"weight_norm_max": 1.0}))


def test_the_measurement_is_packed_by_the_layout_with_its_rule():
    layout = StepLayout.of([(WEIGHT_NORM, torch.tensor([[1.0], [2.0]]))])
    ranks = torch.tensor([[1.0, 5.0], [3.0, 2.0]])  # [world, 2 blocks]
    assert layout.unpack(layout.reduce_ranks(ranks).tolist()) == {"weight_norm": [{"norm": [3.0]}, {"norm": [5.0]}]}


class _Memory(Sink):
    def __init__(self):
        self.info, self.steps, self.alerts, self.evals, self.closed = None, [], [], [], None

    def start(self, info):
        self.info = info

    def step(self, record):
        self.steps.append(record)

    def alert(self, alert):
        self.alerts.append(alert)

    def eval(self, record):
        self.evals.append(record)

    def close(self, steps_seen):
        self.closed = steps_seen


def test_an_in_memory_sink_receives_exactly_what_the_run_folder_gets(tmp_path):
    model, sink = _model(), _Memory()
    # lr 30 makes the loss spike: alerts flow too; attention samples ride in the records
    with TrainingMonitor(model, tmp_path / "run", every=1, echo=False, attention_every=2, sinks=[sink]) as mon:
        _train(mon, model, steps=12, lr=30.0)
    run = read_run(tmp_path / "run")
    # compared as strict JSON: the run diverges to NaN, and NaN != NaN
    assert _json.dumps(sink.steps) == _json.dumps([{k: v for k, v in r.items() if k != "session"} for r in run.records])
    assert any(r["grad_norm"] != r["grad_norm"] for r in sink.steps)  # a NaN step was among them
    assert any("attention" in r for r in sink.steps)
    assert sink.alerts == run.alerts and len(sink.alerts) > 0
    evals = [json.loads(line) for line in (tmp_path / "run" / "evals.jsonl").read_text().splitlines()]
    assert sink.evals == [{k: v for k, v in e.items() if k != "session"} for e in evals]
    assert sink.info["model"] == run.info["model"] and sink.info["settings"] == run.info["settings"]
    assert sink.closed == 12 and run.closed


def test_sinks_alone_keep_no_run_folder(tmp_path):
    sink = _Memory()
    with TrainingMonitor(_model(), None, every=1, echo=False, sinks=[sink]) as mon:
        _train(mon, mon.model)
    assert len(sink.steps) == 4 and sink.closed == 4
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("make, error, builtin", [
    (lambda p: TrainingMonitor(_model(), p, every=0), ConfigError, ValueError),
    (lambda p: TrainingMonitor(_model(), p, spike_bytes=-1), ConfigError, ValueError),
    (lambda p: TrainingMonitor(_model(), None), ConfigError, ValueError),
    (lambda p: TrainingMonitor(_model(), p, sinks=[object()]), UsageError, TypeError),
    (lambda p: TrainingMonitor(_model(), p, sinks="wandb"), UsageError, TypeError),
])
def test_bad_settings_are_diagnose_errors_and_still_the_builtins(tmp_path, make, error, builtin):
    with pytest.raises(error) as caught:
        make(tmp_path / "run")
    assert isinstance(caught.value, DiagnoseError) and isinstance(caught.value, builtin)


def test_calls_out_of_order_and_wrong_types_are_diagnose_errors(tmp_path):
    mon = TrainingMonitor(_model(), tmp_path / "run", every=1, echo=False)
    with pytest.raises(UsageError) as caught:
        mon.log_eval(1.5, loss=1.0)
    assert isinstance(caught.value, TypeError)
    with pytest.raises(UsageError, match="accuracy must be a number"):
        mon.log_eval(1, accuracy="high")
    mon.close()
    for call in (lambda: mon.step(1.0), lambda: mon.log_eval(1, loss=1.0)):
        with pytest.raises(StateError) as caught:
            call()
        assert isinstance(caught.value, RuntimeError)


def test_registering_a_name_twice_is_refused():
    with pytest.raises(ConfigError, match="already registered"):
        register_measurement(Measurement("loss", ("x",), "model", (), _WeightNorms))
    with pytest.raises(ConfigError, match="already registered"):
        register_detector(type("Again", (Detector,), {"kind": "nonfinite", "severity": "error", "hint": "h"}))
