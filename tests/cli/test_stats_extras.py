"""`diagnose stats`: evaluations, throughput and saved spike batches in the summary; --step N;
piped tables keep long names; --follow prints rounded numbers; TensorBoard wall times."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from diagnose import _json
from diagnose.cli.main import cli
from diagnose.monitor import TrainingMonitor, read_run
from diagnose.zoo import ModelConfig, Transformer
from ..tolerance import F64, approx

pytestmark = pytest.mark.numerics


def _train(run_dir, steps=6, nan_at=4, **kw):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, n_heads=2, d_model=16, max_len=8, vocab_size=11))
    opt = torch.optim.SGD(model.parameters(), lr=0.3 * 0.0015)  # 0.00045000000000000004 in binary
    ids = torch.randint(1, 11, (4, 8), generator=torch.Generator().manual_seed(3))  # [B, T]
    with TrainingMonitor(model, run_dir, every=1, echo=False, save_spikes=True, clip=0.5, **kw) as mon:
        for s in range(steps):
            per = F.cross_entropy(model(ids)[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none").mean(1)  # [B]
            loss = per.mean() * (float("nan") if s == nan_at else 1.0)
            loss.backward()
            mon.step(loss, optimizer=opt, batch={"input_ids": ids}, per_example_loss=per.detach())
            opt.step()
            opt.zero_grad()
            if s % 2 == 1:
                mon.log_eval(s, loss=per.mean().item() + 0.1, accuracy=0.5)
            time.sleep(0.01)
    return ids


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    ids = _train(d)
    return d, ids


def test_summary_shows_evals_throughput_clipping_spikes(run):
    d, _ = run
    result = CliRunner().invoke(cli, ["stats", str(d)])
    assert result.exit_code == 0, result.output
    out = result.output
    for text in ("step time median", "tokens/s median", "clipping at 0.5:", "evals 3: last loss nan at step 5",
                 "metrics accuracy", "spike batches saved at steps 4"):
        assert text in out, out
    s = _json.loads(CliRunner().invoke(cli, ["stats", str(d), "--json"]).output)
    r = read_run(d)
    assert s["evals"]["count"] == 3 and s["evals"]["best_loss"] == r.evals["loss"].min()  # the same values read twice
    assert s["spike_steps"] == [4] and s["clipping"]["clip"] == 0.5
    assert s["clipping"]["clipped_share"] == approx((r.steps["clip_coef"].dropna() < 1).mean(), dtype=F64, width=len(r.steps))
    assert s["throughput"]["median_step_time"] == approx(r.steps["step_time"].median(), dtype=F64)


def test_step_shows_the_saved_batch(run):
    d, ids = run
    result = CliRunner().invoke(cli, ["stats", str(d), "--step", "4"])
    assert result.exit_code == 0, result.output
    assert "step 4:" in result.output and "nonfinite" in result.output and "input_ids" in result.output
    view = _json.loads(CliRunner().invoke(cli, ["stats", str(d), "--step", "4", "--json"]).output)
    saved = read_run(d).spikes[0]
    assert view["spike"] == saved and view["step"] == 4
    assert math.isnan(view["record"]["clip_coef"])  # a NaN norm: NaN, as clip_grad_norm_ computes it
    losses = [e["loss"] for e in view["examples"]]
    assert losses == sorted(losses, reverse=True) and len(losses) == 4  # all 4 examples, worst first
    worst = view["examples"][0]
    assert worst["input_ids"] == ids[worst["index"]].tolist()  # the example behind the loss, findable


def test_step_without_batch_and_unknown_step(run):
    d, _ = run
    result = CliRunner().invoke(cli, ["stats", str(d), "--step", "2"])
    assert result.exit_code == 0 and "no batch saved at this step (saved at: 4" in result.output
    result = CliRunner().invoke(cli, ["stats", str(d), "--step", "99"])
    assert result.exit_code == 2 and "step 99 was not logged" in result.output and "[4]" in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


@pytest.mark.slow
def test_piped_tables_keep_long_names(tmp_path):
    torch.manual_seed(0)
    long = "a_block_with_a_very_long_descriptive_name_that_goes_well_past_eighty_columns_of_text"
    model = torch.nn.Module()
    setattr(model, long, torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)]))
    with TrainingMonitor(model, tmp_path, every=1, echo=False) as mon:
        x = torch.randn(2, 3, 4)
        for blk in getattr(model, long):
            x = blk(x)
        x.sum().backward()
        mon.step(x.sum())
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": ""}
    env.pop("COLUMNS")
    out = subprocess.run([sys.executable, "-m", "diagnose", "stats", str(tmp_path)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"{long}.0" in out.stdout and f"{long}.1" in out.stdout


def test_follow_prints_rounded_numbers(run):
    d, _ = run
    result = CliRunner().invoke(cli, ["stats", str(d), "--follow"])
    assert result.exit_code == 0, result.output
    lines = [x for x in result.output.splitlines() if x.startswith("step ") and " grad norm " in x]
    assert len(lines) == 6 and all(" lr 0.00045" in x and "0.000450000" not in x for x in lines)
    assert "s/step" in lines[1] and "tokens/s" in lines[1]


def test_tensorboard_wall_time_is_training_time(run, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    d, _ = run
    result = CliRunner().invoke(cli, ["stats", str(d), "--tensorboard", str(tmp_path / "tb")])
    assert result.exit_code == 0, result.output
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    times = [r["time"] for r in read_run(d).records]
    assert [e.wall_time for e in acc.Scalars("grad_norm")] == approx(times, dtype=F64)  # TensorBoard keeps a double
    assert "tokens_per_s" in acc.Tags()["scalars"]
    ev = read_run(d).evals
    # NaN cells (a metric an evaluation lacks, or here the loss after the NaN step) are left out
    assert [e.step for e in acc.Scalars("eval/loss")] == ev["step"][ev["loss"].notna()].tolist() == [1, 3]
    assert [e.value for e in acc.Scalars("eval/accuracy")] == [0.5, 0.5, 0.5]


@pytest.mark.parametrize("name, text", [
    ("evals.jsonl", '{"step": "three", "loss": 1.0}\n'),
    ("evals.jsonl", '{"step": 3, "loss": 1.0, "metrics": {"acc": "high"}}\n'),
    ("spikes/step_00000001.json", '[1, 2]\n'),
    ("spikes/step_00000002.json", '{"step": 2, '),
])
def test_damaged_evals_or_spike_record_is_skipped_and_counted(tmp_path, name, text):
    """Side files never stop a run from being read (the report skips them too): counted, not fatal."""
    d = tmp_path / "run"
    _train(d, steps=2, nan_at=None)
    (d / name).parent.mkdir(exist_ok=True)
    with open(d / name, "a") as f:
        f.write(text)
    result = CliRunner().invoke(cli, ["stats", str(d)])
    assert result.exit_code == 0 and "1 torn line(s) skipped" in result.output, result.output
    run = read_run(d)
    assert run.skipped_lines == 1 and run.evals["step"].tolist() == [1] and run.spikes == []
