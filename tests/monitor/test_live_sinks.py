"""Live sinks, each with its real library offline: a callable, TensorBoard event files read back,
wandb in offline mode (its run file read back), an MLflow file store (read back by its client)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from diagnose.errors import UsageError
from diagnose.monitor import MLflowSink, TensorBoardSink, TrainingMonitor, WandbSink
from diagnose.monitor._live import flatten
from diagnose.monitor._live_trackers import mlflow_name
from diagnose.zoo import ModelConfig, Transformer
from ..tolerance import approx
from ..versions import required
from .lightning_lm import tiny_lm

pytestmark = pytest.mark.numerics

CFG = ModelConfig(n_layers=2, n_heads=2, d_model=16, max_len=8, vocab_size=11)
NAN_STEP = 3  # the loss given at this step is NaN: a `nonfinite` alert
# in the `test` extra, so CI has them on every row: missing, these tests fail there and skip elsewhere
WANDB = "pip install -e '.[test]' or '.[wandb]'"
# evaluation names the trackers take as they are (MLflow's through mlflow_name): issue 36
NAMES = {"acc@1": 0.5, "m" * 300: 0.25, "précision·β": 0.125}
MLFLOW = "pip install -e '.[test]' or '.[mlflow]'"


def _train(run_dir, sinks) -> tuple[list[dict], list[dict]]:
    """Five steps (attention every 2nd, one evaluation); the run folder's records and alerts."""
    torch.manual_seed(0)
    model = Transformer(CFG)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    with TrainingMonitor(model, run_dir, attention_every=2, every=1, echo=False, sinks=sinks) as monitor:
        for s in range(5):
            ids = torch.randint(0, CFG.vocab_size, (4, CFG.max_len), generator=gen)  # [B, T]
            loss = F.cross_entropy(model(ids).reshape(-1, CFG.vocab_size), ids.reshape(-1))
            loss.backward()
            monitor.step(torch.tensor(math.nan) if s == NAN_STEP else loss, optimizer=opt)
            opt.step()
            opt.zero_grad()
        monitor.log_eval(4, loss=1.25, accuracy=0.5, **NAMES)
    lines = lambda name: [json.loads(x) for x in (run_dir / name).read_text().splitlines()]  # noqa: E731
    return lines("metrics.jsonl"), lines("alerts.jsonl")


def _check_names(records: list[dict], logged: dict[int, dict[str, float]]) -> None:
    """Every number of every record arrived under its flattened name, at its step."""
    for r in records:
        want = flatten(r)
        assert want and all(k.startswith("diagnose/") for k in want)
        got = logged[r["step"]]
        assert set(want) <= set(got), sorted(set(want) - set(got))[:5]
    sampled = [flatten(r) for r in records if r["step"] % 2 == 0]  # attention every 2nd step
    assert sampled and all(any(k.endswith("/entropy/head1") for k in want) for want in sampled)


def test_callable_sink_streams_every_scalar_and_alert(tmp_path):
    logged: dict[int, dict[str, float]] = {}
    records, alerts = _train(tmp_path / "run", [lambda scalars, step: logged.setdefault(step, {}).update(scalars)])
    _check_names(records, logged)
    for r in (r for r in records if r["step"] != NAN_STEP):
        assert logged[r["step"]]["diagnose/loss"] == r["loss"]  # the same float, passed through
    assert math.isnan(logged[NAN_STEP]["diagnose/loss"])
    assert alerts and logged[NAN_STEP]["diagnose/alerts/nonfinite"] == 2.0  # an error
    assert logged[4]["diagnose/eval/loss"] == 1.25 and logged[4]["diagnose/eval/accuracy"] == 0.5
    assert {n: logged[4][f"diagnose/eval/{n}"] for n in NAMES} == NAMES


def test_tensorboard_sink_event_file_reads_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records, alerts = _train(tmp_path / "run", [TensorBoardSink(tmp_path / "tb")])
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    logged: dict[int, dict[str, float]] = {}
    for tag in acc.Tags()["scalars"]:
        for ev in acc.Scalars(tag):
            logged.setdefault(ev.step, {})[tag] = ev.value
    _check_names(records, logged)
    for r in (r for r in records if r["step"] != NAN_STEP):  # event files hold float32
        assert logged[r["step"]]["diagnose/loss"] == approx(r["loss"])
    assert logged[NAN_STEP]["diagnose/alerts/nonfinite"] == 2.0
    assert any(t.startswith("diagnose/alert_text/nonfinite") for t in acc.Tags()["tensors"])  # the alert's text
    assert {n: logged[4][f"diagnose/eval/{n}"] for n in NAMES} == approx(NAMES)  # every name as it is


def test_wandb_sink_offline_run_reads_back(tmp_path, monkeypatch):
    wandb = required("wandb", WANDB)
    from .wandb_log import history, summary

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    run = wandb.init(project="diagnose-test", dir=str(tmp_path))
    try:
        records, alerts = _train(tmp_path / "run", [WandbSink()])
    finally:
        run.finish()
        wandb.teardown()  # wandb-core may still be writing the file after finish(): wait for it
    (path,) = list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    logged: dict[int, dict[str, float]] = {}
    for row in history(path):
        if "diagnose/step" in row:
            logged.setdefault(row["diagnose/step"], {}).update(
                {k: v for k, v in row.items() if k.startswith("diagnose/") and isinstance(v, (int, float))})
    _check_names(records, logged)
    for r in (r for r in records if r["step"] != NAN_STEP):
        assert logged[r["step"]]["diagnose/loss"] == r["loss"]
    assert logged[NAN_STEP]["diagnose/alerts/nonfinite"] == 2.0
    assert summary(path)["diagnose/alert_text/nonfinite"].startswith(f"step {NAN_STEP}: loss")
    assert {n: logged[4][f"diagnose/eval/{n}"] for n in NAMES} == NAMES  # every name as it is


def test_wandb_sink_without_a_run_says_so(tmp_path, monkeypatch):
    wandb = required("wandb", WANDB)
    if wandb.run is not None:
        pytest.skip("a wandb run is active in this process")
    with pytest.raises(UsageError, match=r"wandb\.init"):  # refused when made, before any training
        WandbSink()


def test_mlflow_sink_file_store_reads_back(tmp_path, monkeypatch):
    required("mlflow", MLFLOW)
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.7+ keeps the file store behind this

    uri = (tmp_path / "mlruns").as_uri()
    sink = MLflowSink(tracking_uri=uri)
    records, alerts = _train(tmp_path / "run", [sink])
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(sink.run_id)
    assert run.info.status == "FINISHED"  # the sink opened this run, so it closed it
    logged: dict[int, dict[str, float]] = {}
    for key in run.data.metrics:
        for m in client.get_metric_history(sink.run_id, key):
            logged.setdefault(m.step, {})[key] = m.value
    finite = [{k: v for k, v in r.items() if not (isinstance(v, float) and not math.isfinite(v))} for r in records]
    _check_names(finite, logged)
    for r in (r for r in records if r["step"] != NAN_STEP):
        assert logged[r["step"]]["diagnose/loss"] == r["loss"]
    assert "diagnose/loss" not in logged.get(NAN_STEP, {})  # NaN left out of MLflow, kept in the run folder
    assert logged[NAN_STEP]["diagnose/alerts/nonfinite"] == 2.0
    assert run.data.tags["diagnose/alert_text/nonfinite"].startswith(f"step {NAN_STEP}: loss")
    assert {n: logged[4][mlflow_name(f"diagnose/eval/{n}")] for n in NAMES} == NAMES  # the names MLflow takes


@pytest.mark.slow
def test_lightning_callback_streams_into_the_trainers_own_logger(tmp_path):
    L = pytest.importorskip("lightning.pytorch")
    import csv

    from lightning.pytorch.loggers import CSVLogger

    from diagnose.monitor.lightning import DiagnoseCallback

    Module = tiny_lm(L)
    ids = torch.randint(1, 11, (12, 8), generator=torch.Generator().manual_seed(0))  # [N, T]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)
    logger = CSVLogger(str(tmp_path / "logs"), name="csv")
    trainer = L.Trainer(max_steps=3, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", default_root_dir=str(tmp_path),
                        callbacks=[DiagnoseCallback(tmp_path / "diag", every=1, echo=False, loggers=True)])
    trainer.fit(Module(), loader)
    records = [json.loads(x) for x in (tmp_path / "diag" / "metrics.jsonl").read_text().splitlines()]
    rows = list(csv.DictReader(open(tmp_path / "logs" / "csv" / "version_0" / "metrics.csv")))
    by_step = {int(r["step"]): r for r in rows if r.get("diagnose/loss")}
    assert sorted(by_step) == [r["step"] for r in records] == [0, 1, 2]
    for r in records:
        assert float(by_step[r["step"]]["diagnose/loss"]) == approx(r["loss"])
        assert float(by_step[r["step"]]["diagnose/layers/net.blocks.1/grad_norm"]) == approx(
            r["layers"]["net.blocks.1"]["grad_norm"])


@pytest.mark.slow
def test_hf_callback_streams_into_the_trainers_tensorboard(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from diagnose.monitor.hf import DiagnoseHFCallback

    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=11, n_positions=8)
    ids = torch.randint(0, 11, (12, 8), generator=torch.Generator().manual_seed(0))  # [N, T]
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=4,
                                          report_to=["tensorboard"], save_strategy="no", logging_steps=1,
                                          use_cpu=True, disable_tqdm=True)
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(cfg), args=args,
                                   train_dataset=[{"input_ids": x, "labels": x} for x in ids],
                                   callbacks=[DiagnoseHFCallback(tmp_path / "diag", every=1, echo=False, trackers=True)])
    trainer.train()
    records = [json.loads(x) for x in (tmp_path / "diag" / "metrics.jsonl").read_text().splitlines()]
    (logdir,) = list((tmp_path / "out" / "runs").glob("**/diagnose"))
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    got = {ev.step: ev.value for ev in acc.Scalars("diagnose/loss")}
    assert sorted(got) == [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert got[r["step"]] == approx(r["loss"])
