"""Sinks are guests (issue 36): a sink that raises in any call is warned about once, by name, and dropped,
and the run folder, the alerts, on_alert, raise_on and the spike batch are exactly a sink-free run's; a sink
that cannot work is refused when it is made; each sink gets its own copy of a record; a slow sink's time is
not the step's. The real trackers offline: MLflow's file store, Lightning's MLFlowLogger, wandb offline."""

from __future__ import annotations

import json
import re
import types
import warnings

import pytest
import torch

from diagnose.errors import ConfigError, TrainingAlertError, UsageError
from diagnose.monitor import MLflowSink, Sink, TensorBoardSink, TrainingMonitor, WandbSink
from diagnose.monitor import _sinks
from diagnose.monitor._live_trackers import mlflow_name
from diagnose.zoo import Transformer
from ..versions import required
from .hostile_runs import CFG, NAN_STEP, dropped, folder as _folder, train as _train

pytestmark = pytest.mark.numerics


@pytest.fixture(scope="module")
def sink_free(tmp_path_factory):
    run = tmp_path_factory.mktemp("free") / "run"
    seen = _train(run)
    return _folder(run), seen


class Raises(Sink):
    """A sink whose `method` raises (every other call does nothing)."""

    def __init__(self, method: str):
        self.method, self.calls = method, []

    def _maybe(self, name: str) -> None:
        self.calls.append(name)
        if name == self.method:
            raise RuntimeError(f"tracker offline in {name}\n  (a second line the warning folds)")

    def start(self, info): self._maybe("start")
    def step(self, record): self._maybe("step")
    def alert(self, alert): self._maybe("alert")
    def eval(self, record): self._maybe("eval")
    def close(self, steps_seen): self._maybe("close")


def _raising_fn(scalars, step):
    raise ValueError("my logger broke")


class Unreadable(Exception):
    def __str__(self):
        raise RuntimeError("the message of the message")


class Mute(Raises):
    """Its step() raises an exception whose message cannot be read, and its `fix` raises too."""

    @property
    def fix(self):
        raise AttributeError("no fix") from RuntimeError("deeper")

    def step(self, record):
        self.calls.append("step")
        raise Unreadable()


FAILING = [("start", lambda: Raises("start"), "Raises", "start()"),
           ("step", lambda: Raises("step"), "Raises", "step()"),
           ("alert", lambda: Raises("alert"), "Raises", "alert()"),
           ("eval", lambda: Raises("eval"), "Raises", "eval()"),
           ("close", lambda: Raises("close"), "Raises", "close()"),
           ("a function", lambda: _raising_fn, "CallableSink(_raising_fn)", "step()"),
           ("an unreadable error", lambda: Mute(None), "Mute", "step()")]


@pytest.mark.parametrize("what, make, name, call", FAILING, ids=[c[0] for c in FAILING])
def test_a_failing_sink_is_dropped_once_and_the_run_is_a_sink_free_one(tmp_path, sink_free, what, make, name, call):
    sink = make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = _train(tmp_path / "run", [sink])  # completes: the with block does not raise
    said = dropped(caught)
    assert len(said) == 1 and name in said[0] and call in said[0] and "fix:" in said[0], said
    assert "\n" not in said[0]
    assert _folder(tmp_path / "run") == sink_free[0]  # metrics, alerts, evals, run.json (closed), spikes
    assert seen == sink_free[1] and "nonfinite" in [a["kind"] for a in seen]
    failed = call.removesuffix("()")
    calls = getattr(sink, "calls", [failed, "close"])  # a plain function keeps no list of calls
    after = calls[calls.index(failed) + 1:]  # dropped: nothing after the failing call but one close(), to let go
    assert set(after) <= {"close"} and calls.count("close") == 1, calls


def test_raise_on_still_stops_the_run_beside_a_failing_sink(tmp_path):
    with pytest.warns(RuntimeWarning, match="sink Raises failed in step"):
        with pytest.raises(TrainingAlertError, match="nonfinite"):
            _train(tmp_path / "run", [Raises("step")], raise_on=("nonfinite",))
    alerts = [json.loads(x) for x in (tmp_path / "run" / "alerts.jsonl").read_text().splitlines()]
    assert [a["step"] for a in alerts if a["kind"] == "nonfinite"] == [NAN_STEP]
    assert json.loads((tmp_path / "run" / "run.json").read_text())["closed"] is True


class Mutates(Sink):
    def step(self, record):
        record["loss"] = -1.0
        record["layers"].clear()


class Keeps(Sink):
    def __init__(self):
        self.records = []

    def step(self, record):
        self.records.append(record)


def test_each_sink_gets_its_own_copy_of_a_record(tmp_path, sink_free):
    keeps = Keeps()
    _train(tmp_path / "run", [Mutates(), keeps])
    assert _folder(tmp_path / "run") == sink_free[0]
    written = sink_free[0]["metrics.jsonl"]
    assert [r["layers"] for r in keeps.records] == [r["layers"] for r in written]  # untouched by the first sink
    assert [r["loss"] for r in keeps.records if r["step"] != NAN_STEP] == \
        [r["loss"] for r in written if r["step"] != NAN_STEP]


class Clock:
    """A perf_counter that moves one second per reading; a sink moves it on by `lag`."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0
        return self.now


def test_a_slow_sinks_time_is_not_the_steps_time_and_is_shown_apart(tmp_path, monkeypatch):
    from diagnose.monitor import read_run

    from ..cli.hostile import invoke

    clock = Clock()
    monkeypatch.setattr("diagnose.monitor._monitor.time.perf_counter", clock)
    monkeypatch.setattr(_sinks, "_clock", clock)

    class Slow(Sink):
        def step(self, record):
            clock.now += 1000.0  # an hour-long upload, by this clock

    steps = {}
    for name, sinks in (("slow", [Slow()]), ("quick", [Sink()])):
        _train(tmp_path / name, sinks, every=1)
        steps[name] = read_run(tmp_path / name).steps.iloc[1:]  # the first logged step has no time
    slow, quick = steps["slow"], steps["quick"]
    assert len(slow) == 4 and list(slow["step_time"]) == list(quick["step_time"]) and (quick["step_time"] < 1000).all()
    assert (slow["sink_time"] >= 1000).all() and (quick["sink_time"] < 1000).all()  # its own field, apart
    out = invoke("stats", tmp_path / "slow").output  # the summary may wrap at any space (the terminal width)
    assert re.search(r"sinks\s+median\s+1\d{3}\s+s/step", out)  # readers show it


def test_sinks_that_cannot_work_are_refused_when_made(tmp_path):
    with pytest.raises(UsageError, match="the class TensorBoardSink.*an instance"):
        TrainingMonitor(Transformer(CFG), tmp_path / "run", sinks=[TensorBoardSink])
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="dangling symlink"):
        TensorBoardSink(tmp_path / "gone")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # wandb.init starts wandb's service process: ~15 s on a busy 2-core box
def test_a_wandb_run_finished_mid_training_drops_its_sink_and_is_refused_when_made(tmp_path, monkeypatch, sink_free):
    wandb = required("wandb", "pip install -e '.[test]' or '.[wandb]'")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="diagnose-test", dir=str(tmp_path))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            seen = _train(tmp_path / "run", [WandbSink(run=run)], after_step=lambda s: s == 1 and run.finish())
    finally:
        run.finish()
    said = dropped(caught)  # wandb: "Run (...) is finished. The call to `log` will be ignored."
    assert len(said) == 1 and "sink WandbSink failed" in said[0] and WandbSink.fix in said[0], said
    assert _folder(tmp_path / "run") == sink_free[0] and seen == sink_free[1]
    with pytest.raises(UsageError, match="finished"):
        WandbSink(run=run)


def test_names_mlflow_refuses_are_rewritten_one_way():
    long = "diagnose/eval/" + "m" * 300
    assert mlflow_name("diagnose/eval/acc@1") == "diagnose/eval/acc_1"
    assert mlflow_name("diagnose/layers/../x") == "diagnose/layers/_/x"
    assert len(mlflow_name(long)) == 250 and mlflow_name(long) == mlflow_name(long)
    assert mlflow_name(long) != mlflow_name(long + "n")  # a cut name keeps a digest of the whole
    assert mlflow_name("diagnose/loss") == "diagnose/loss"


HOSTILE_NAMES = {"acc@1": 0.5, "m" * 300: 0.25, "top-1 %": 0.75}


def _mlflow_logged(uri: str, run_id: str) -> dict[str, float]:
    from mlflow import MlflowClient

    return dict(MlflowClient(tracking_uri=uri).get_run(run_id).data.metrics)


def test_mlflow_sink_takes_names_it_would_refuse(tmp_path, monkeypatch):
    required("mlflow", "pip install -e '.[test]' or '.[mlflow]'")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    sink = MLflowSink(tracking_uri=uri)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no sink is dropped
        with TrainingMonitor(Transformer(CFG), tmp_path / "run", echo=False, sinks=[sink]) as monitor:
            monitor.log_eval(0, loss=1.0, **HOSTILE_NAMES)
    assert monitor.sinks[-1].run_id == sink.run_id  # the guard reads the sink's own attributes through
    logged = _mlflow_logged(uri, sink.run_id)
    for name, value in HOSTILE_NAMES.items():
        assert logged[mlflow_name(f"diagnose/eval/{name}")] == value


def test_an_mlflow_run_deleted_mid_training_is_dropped_and_the_run_goes_on(tmp_path, monkeypatch, sink_free):
    required("mlflow", "pip install -e '.[test]' or '.[mlflow]'")
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    sink, client = MLflowSink(tracking_uri=uri), MlflowClient(tracking_uri=uri)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = _train(tmp_path / "run", [sink], after_step=lambda s: s == 1 and client.delete_run(sink.run_id))
    said = dropped(caught)  # MLflow refuses the next write: the run "must be in 'active' lifecycle_stage"
    assert len(said) == 1 and "sink MLflowSink failed" in said[0] and MLflowSink.fix in said[0], said
    assert _folder(tmp_path / "run") == sink_free[0] and seen == sink_free[1]


class Keeper:
    """A logger with Lightning's log_metrics that keeps what it is given."""

    def __init__(self):
        self.logged: list[tuple[int, dict]] = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, dict(metrics)))


class Down:
    """A logger whose server is gone."""

    fix = "restart the logging server"

    def log_metrics(self, metrics, step):
        raise ConnectionError("logging server down")


def test_one_lightning_logger_failing_leaves_the_others_streaming(tmp_path, sink_free):
    from diagnose.monitor._live_trackers import LightningLoggersSink

    keeper = Keeper()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = _train(tmp_path / "run", [LightningLoggersSink(types.SimpleNamespace(loggers=[Down(), keeper]))])
    said = dropped(caught)
    assert len(said) == 1 and "Lightning logger Down failed" in said[0] and Down.fix in said[0], said
    assert _folder(tmp_path / "run") == sink_free[0] and seen == sink_free[1]
    written = sink_free[0]
    steps = sorted([r["step"] for r in written["metrics.jsonl"]] + [a["step"] for a in written["alerts.jsonl"]])
    assert [s for s, _ in keeper.logged] == steps + [4]  # every record and alert, then the evaluation at 4


@pytest.mark.slow  # importing Lightning and making an MLflow experiment: ~30 s on a busy 2-core box
def test_lightning_mlflow_logger_gets_the_same_names(tmp_path, monkeypatch):
    pytest.importorskip("lightning.pytorch")
    required("mlflow", "pip install -e '.[test]' or '.[mlflow]'")
    from lightning.pytorch.loggers import MLFlowLogger

    from diagnose.monitor._live_trackers import LightningLoggersSink

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    logger = MLFlowLogger(experiment_name="diagnose-test", tracking_uri=uri, prefix="fit")  # "fit-" + each name
    sink = LightningLoggersSink(types.SimpleNamespace(loggers=[Down(), logger]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # Lightning's own stripping would warn
        with TrainingMonitor(Transformer(CFG), tmp_path / "run", echo=False, sinks=[sink]) as monitor:
            monitor.log_eval(0, loss=1.0, nan_metric=float("nan"), **HOSTILE_NAMES)
    assert [str(w.message) for w in caught if "diagnose" in str(w.message) or "MLFlow" in str(w.message)] == \
        dropped(caught) and len(dropped(caught)) == 1  # the broken logger, said once; nothing from Lightning
    logged = _mlflow_logged(uri, logger.run_id)
    for name, value in HOSTILE_NAMES.items():  # its prefix counted in MLflow's 250 characters
        assert logged["fit-" + mlflow_name(f"diagnose/eval/{name}", 250 - len("fit-"))] == value
    assert max(len(k) for k in logged) <= 250 and not any("nan_metric" in k for k in logged)  # NaN left out


def test_streaming_to_no_tracker_says_so(tmp_path):
    from diagnose.monitor.hf import _tracker_sinks

    with pytest.warns(RuntimeWarning, match="trackers=True.*nothing is streamed"):
        assert _tracker_sinks(types.SimpleNamespace(report_to=["none"], output_dir=str(tmp_path))) == []


def test_a_tracker_without_its_run_is_said_and_the_others_stream(tmp_path):
    wandb = required("wandb", "pip install -e '.[test]' or '.[wandb]'")
    pytest.importorskip("tensorboard")
    from diagnose.monitor.hf import _tracker_sinks

    if wandb.run is not None:
        pytest.skip("a wandb run is active in this process")
    args = types.SimpleNamespace(report_to=["wandb", "tensorboard"], output_dir=str(tmp_path), logging_dir=None)
    with pytest.warns(RuntimeWarning, match=r"streams nothing to wandb \(WandbSink: no wandb run: call wandb\.init"):
        sinks = _tracker_sinks(args)  # in on_train_begin: trainer.train() goes on
    assert [type(s).__name__ for s in sinks] == ["TensorBoardSink"]
    sinks[0].close(0)


@pytest.mark.slow  # importing Lightning: ~25 s on a busy 2-core box
def test_streaming_to_no_logger_says_so(tmp_path):
    pytest.importorskip("lightning.pytorch")
    from diagnose.monitor.lightning import DiagnoseCallback

    trainer = types.SimpleNamespace(loggers=[], is_global_zero=True, gradient_clip_val=None)
    callback = DiagnoseCallback(tmp_path / "run", loggers=True, echo=False)
    with pytest.warns(RuntimeWarning, match="loggers=True.*nothing is streamed"):
        callback.on_fit_start(trainer, Transformer(CFG))
    callback.monitor.close()
