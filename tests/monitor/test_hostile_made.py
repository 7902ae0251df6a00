"""Settings and sinks that cannot work are refused when they are made (issue 36), with one line
naming what and the fix, before any run folder exists: the real trackers' sinks (TensorBoard,
MLflow's file store, wandb without a run, Lightning's loggers), a sink function of the wrong shape,
Thresholds values that would crash a detector at step 0 or later, and the monitor's own settings
that crashed a later step, did something else silently, or wrote a run.json its readers refuse."""

from __future__ import annotations

import os
import re
import types

import numpy as np
import pytest
import torch

from diagnose.errors import ConfigError, OutputError, UsageError
from diagnose.monitor import MLflowSink, TensorBoardSink, Thresholds, TrainingMonitor, WandbSink
from diagnose.monitor._live_trackers import LightningLoggersSink
from diagnose.zoo import Transformer
from ..versions import required
from .hostile_runs import CFG

pytestmark = pytest.mark.numerics

MLFLOW = "pip install -e '.[test]' or '.[mlflow]'"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """An MLflow file store holding one deleted run: (its URI, that run's id)."""
    required("mlflow", MLFLOW)
    from mlflow import MlflowClient

    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.7+ keeps the file store behind this
    uri = (tmp_path_factory.mktemp("store") / "mlruns").as_uri()
    client = MlflowClient(tracking_uri=uri)
    gone = client.create_run("0").info.run_id
    client.delete_run(gone)
    yield uri, gone
    mp.undo()


def _monitor(tmp, sinks):
    return TrainingMonitor(Transformer(CFG), tmp / "run", sinks=sinks)


MADE = [("a TensorBoard logdir that is no path", lambda tmp, st: TensorBoardSink(5), UsageError, "not a path"),
        ("a TensorBoard flush_secs that is a word",
         lambda tmp, st: TensorBoardSink(tmp / "tb", flush_secs="10"), ConfigError, "flush_secs"),
        ("a TensorBoard logdir under a file",
         lambda tmp, st: TensorBoardSink(tmp / "a_file" / "tb"), OutputError, "cannot be written"),
        ("a TensorBoard writer that is none",
         lambda tmp, st: TensorBoardSink(writer=object()), UsageError, "not a SummaryWriter"),
        ("a sink function of one argument",
         lambda tmp, st: _monitor(tmp, [lambda scalars: None]), UsageError, "f(scalars, step)"),
        ("an MLflow run id that is no string", lambda tmp, st: MLflowSink(7), UsageError, "run_id"),
        ("an MLflow store MLflow cannot open",
         lambda tmp, st: MLflowSink(tracking_uri="nosuchscheme://x"), ConfigError, "tracking store"),
        ("an MLflow run the store lacks",
         lambda tmp, st: MLflowSink("nosuchrun", tracking_uri=st[0]), UsageError, "no run 'nosuchrun'"),
        ("an MLflow experiment the store lacks",
         lambda tmp, st: MLflowSink(experiment_id="999", tracking_uri=st[0]), UsageError, "no experiment '999'"),
        ("a deleted MLflow run", lambda tmp, st: MLflowSink(st[1], tracking_uri=st[0]), UsageError, "is deleted"),
        ("a wandb run that is a word", lambda tmp, st: WandbSink(run="my-run"), UsageError, "not a wandb run"),
        ("Lightning loggers that are a word",
         lambda tmp, st: LightningLoggersSink(types.SimpleNamespace(loggers="csv")), UsageError, "not a list")]


@pytest.mark.parametrize("what, make, error, words", MADE, ids=[c[0] for c in MADE])
def test_a_sink_that_cannot_work_is_refused_when_made(tmp_path, store, what, make, error, words):
    if "wandb" in what:
        required("wandb", "pip install -e '.[test]' or '.[wandb]'")
    (tmp_path / "a_file").write_text("mine")
    with pytest.raises(error, match=re.escape(words)) as caught:
        make(tmp_path, store)
    assert "\n" not in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # no run folder, no logdir
    assert (tmp_path / "a_file").read_text() == "mine"


THRESHOLDS = [("a 400-digit ratio", dict(grad_spike_ratio=10 ** 400), "grad_spike_ratio"),
              ("a window past int64", dict(window=2 ** 64), "2\\*\\*63 - 1"),
              ("a diverge_window past int64", dict(diverge_window=2 ** 70), "diverge_window"),
              ("an extra count of 2.5", dict(extra={"z_patience": 2.5}), "z_patience.*whole number"),
              ("an extra count a word", dict(extra={"z_patience": "3"}), "z_patience.*whole number"),
              ("an extra 400-digit limit", dict(extra={"z_rms_max": 10 ** 400}), "z_rms_max"),
              ("an extra count past int64", dict(extra={"rank_grace": 10 ** 30}), "rank_grace")]


@pytest.mark.parametrize("what, kw, words", THRESHOLDS, ids=[c[0] for c in THRESHOLDS])
def test_thresholds_that_would_crash_a_detector_are_refused_when_made(what, kw, words):
    with pytest.raises(ConfigError, match=words) as caught:
        Thresholds(**kw)
    assert "\n" not in str(caught.value)


def test_numpy_thresholds_are_kept_as_python_numbers(tmp_path):
    t = Thresholds(window=np.int64(7), cooldown=np.int32(5), grad_spike_ratio=np.float32(4.0),
                   extra={"z_patience": np.int64(2), "z_rms_max": np.float64(9.5)})
    assert type(t.window) is int and type(t.cooldown) is int and type(t.grad_spike_ratio) is float
    assert t.extra == {"z_patience": 2, "z_rms_max": 9.5} and type(t.extra["z_patience"]) is int
    with TrainingMonitor(Transformer(CFG), tmp_path / "run", thresholds=t, echo=False):
        pass  # the detectors are made on them: deque(maxlen=np.int64) was a TypeError at step 0


SETTINGS = [("every a word", dict(every="10"), ConfigError, "every must be a whole number"),
            ("every 2.5", dict(every=2.5), ConfigError, "every must be a whole number"),
            ("attention_every NaN", dict(attention_every=float("nan")), ConfigError, "attention_every"),
            ("clip a word", dict(clip="1.0"), ConfigError, "clip must be"),
            ("clip NaN", dict(clip=float("nan")), ConfigError, "clip must be"),
            ("clip negative", dict(clip=-1.0), ConfigError, "clip must be"),
            ("spike_bytes 1e300", dict(spike_bytes=1e300), ConfigError, "spike_bytes must be a whole number"),
            ("spike_limit past int64", dict(spike_limit=2 ** 64), ConfigError, "spike_limit"),
            ("save_spikes a word", dict(save_spikes="no"), UsageError, "save_spikes must be True or False"),
            ("echo a word", dict(echo="off"), UsageError, "echo must be True or False"),
            ("on_alert no function", dict(on_alert="print"), UsageError, "on_alert must be a function"),
            ("raise_on a misspelt kind", dict(raise_on=["nonfinte"]), ConfigError, "'nonfinte', which no registered"),
            ("stop_on a number", dict(stop_on=[3]), UsageError, "stop_on must list alert kinds"),
            ("skip_on None", dict(skip_on=None), UsageError, "skip_on must be an alert kind"),
            ("settings a word", dict(settings="fast"), UsageError, "settings must be a dict"),
            ("settings overwriting every", dict(settings={"every": "x"}), ConfigError, "monitor's own 'every'"),
            ("settings no JSON", dict(settings={"note": object()}), ConfigError, "cannot go into run.json"),
            ("settings a 400-digit number", dict(settings={"n": 10 ** 400}), ConfigError, "cannot go into run.json")]


@pytest.mark.parametrize("what, kw, error, words", SETTINGS, ids=[c[0] for c in SETTINGS])
def test_monitor_settings_are_refused_when_made(tmp_path, what, kw, error, words):
    with pytest.raises(error, match=re.escape(words)) as caught:
        TrainingMonitor(Transformer(CFG), tmp_path / "run", **kw)
    assert "\n" not in str(caught.value) and not (tmp_path / "run").exists()


STEP_ARGS = [("a loss that is a word", dict(loss="abc"), UsageError, "step(loss=...) must be a number"),
             ("a 400-digit loss", dict(loss=10 ** 400), ConfigError, "step(loss=...) is an integer too large"),
             ("a loss of two numbers", dict(loss=torch.tensor([1.0, 2.0])), UsageError, "got a tensor of shape [2]"),
             ("an lr that is a word", dict(lr="1e-3"), UsageError, "step(lr=...) must be a number"),
             ("a 400-digit lr", dict(lr=10 ** 400), ConfigError, "step(lr=...) is an integer too large"),
             ("negative tokens", dict(tokens=-5), ConfigError, "step(tokens=...) must be from 0"),
             ("micro-batches past int64", dict(micro_batches=10 ** 30), ConfigError, "step(micro_batches=...)"),
             ("an eval metric of two numbers", dict(eval={"acc": torch.tensor([0.5, 0.7])}), UsageError,
              "log_eval: acc must be one number")]


@pytest.mark.parametrize("what, kw, error, words", STEP_ARGS, ids=[c[0] for c in STEP_ARGS])
def test_step_arguments_are_refused_before_anything_is_written(tmp_path, what, kw, error, words):
    from diagnose.monitor import read_run

    model = Transformer(CFG)
    ids = torch.randint(0, CFG.vocab_size, (2, CFG.max_len), generator=torch.Generator().manual_seed(0))  # [B, T]
    with TrainingMonitor(model, tmp_path / "run", every=1, echo=False) as monitor:
        model(ids).sum().backward()
        with pytest.raises(error, match=re.escape(words)) as caught:
            monitor.log_eval(0, **kw["eval"]) if "eval" in kw else monitor.step(kw.pop("loss", 1.0), **kw)
        monitor.step(1.0)  # the monitor goes on: the refused call wrote nothing
    assert "\n" not in str(caught.value)
    run = read_run(tmp_path / "run")  # the folder reads back: nothing its readers refuse was written
    assert list(run.steps["step"]) == [0] and len(run.evals) == 0 and run.skipped_lines == 0


def _fifo(tmp):
    os.mkfifo(tmp / "pipe")
    return tmp / "pipe"


RUN_DIRS = [("a file", lambda tmp: tmp / "a_file", OutputError, "must be a folder, but it is a file"),
            ("a dangling symlink", lambda tmp: (tmp / "gone").symlink_to(tmp / "nowhere") or tmp / "gone",
             OutputError, "symbolic link to nothing"),
            ("a FIFO", _fifo, OutputError, "it is a FIFO"),
            ("a folder under a file", lambda tmp: tmp / "a_file" / "run", OutputError, "not a folder"),
            ("a number", lambda tmp: 7, UsageError, "run_dir (int) is not a folder's path")]


@pytest.mark.parametrize("what, where, error, words", RUN_DIRS, ids=[c[0] for c in RUN_DIRS])
def test_a_run_dir_that_cannot_be_a_folder_is_one_line_when_made(tmp_path, what, where, error, words):
    (tmp_path / "a_file").write_text("mine")
    run_dir = where(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(error, match=re.escape(words)) as caught:  # was a raw "File exists" at set-up
        TrainingMonitor(Transformer(CFG), run_dir, echo=False)
    assert "\n" not in str(caught.value) and sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "a_file").read_text() == "mine"
