"""The memory pre-flight: sizes, the probe, a cap that shrinks the micro-batch and the heads per
forward without changing any result, and --max-memory end to end."""

from __future__ import annotations

import json

import pytest
import torch

from diagnose.ablation import ablate_heads
from diagnose.ablation.plan import footprint, micro_batches, parse_size, plan_sweep
from diagnose.errors import ConfigError
from diagnose.sites import find_heads
from diagnose.zoo import ModelConfig, Transformer

from .helpers import loss_tol
from ..tolerance import approx, size_of

pytestmark = pytest.mark.numerics

V, T, N, H, D = 20, 7, 12, 4, 8


def test_parse_size():
    assert parse_size(None) is None
    assert parse_size(1000) == 1000
    assert parse_size("512MB") == 512 * 2 ** 20
    assert parse_size("1.5g") == int(1.5 * 2 ** 30)
    assert parse_size(" 4 GiB ") == 4 * 2 ** 30
    for bad in ("lots", "-1GB", "0", "3 parsecs"):
        with pytest.raises(ConfigError, match="max_memory"):
            parse_size(bad)


def test_footprint_counts_what_one_example_holds(model, data):
    sites = find_heads(model)
    one = footprint(model, sites, {k: v[:1] for k, v in data.items()})
    assert one.logits == T * V * 4  # float32 logits of one example
    assert one.hidden == T * H * D * 4 and one.n_blocks == 2  # a block's output: the residual stream
    assert one.largest >= max(one.logits, one.hidden) and one.saved > one.largest


def test_micro_batches_cut_every_tensor_with_the_batch_dim(data):
    labels = torch.arange(N)
    parts = micro_batches([(data, labels)], 5)
    assert [p[0]["input_ids"].shape[0] for p in parts] == [5, 5, 2]
    assert torch.equal(torch.cat([p[1] for p in parts]), labels)
    assert torch.equal(torch.cat([p[0]["attention_mask"] for p in parts]), data["attention_mask"])


def test_plan_fits_the_free_memory(model, data):
    sites = find_heads(model)
    batches = [(data, None)]
    roomy = plan_sweep(model, sites, batches, free=2 ** 40)
    assert (roomy.micro_batch, roomy.replication, roomy.limited_by) == (N, H, "batch")
    fp = footprint(model, sites, {k: v[:1] for k, v in data.items()})
    free = int(fp.step_bytes(1, 3) / 0.7) + 1
    tight = plan_sweep(model, sites, batches, free=free)
    assert tight.micro_batch == 3 and tight.limited_by == "memory"
    assert tight.estimated_step_bytes <= 0.7 * free
    unknown = plan_sweep(model, sites, batches, free=None)
    assert unknown.free_bytes is None and unknown.micro_batch == N


def test_small_max_memory_means_smaller_steps_and_the_same_result(model, data):
    kw = dict(task="lm", batch_size=N, progress=False, attention=False)
    full = ablate_heads(model, data, **kw)
    fp = footprint(model, find_heads(model), {k: v[:1] for k, v in data.items()})
    cap = fp.step_bytes(2, 4)
    small = ablate_heads(model, data, max_memory=cap, **kw)
    assert (full.timing["micro_batch"], full.timing["replication"]) == (N, H)
    assert small.timing["micro_batch"] < N and small.timing["memory_plan"]["limited_by"] == "memory"
    assert small.timing["memory_plan"]["max_memory_bytes"] == cap
    assert small.timing["memory_plan"]["estimated_step_bytes"] <= cap
    assert small.timing["forward_passes"] > full.timing["forward_passes"]
    assert small.baseline["loss"] == pytest.approx(full.baseline["loss"], abs=loss_tol(full.baseline["loss"], **size_of(model)))
    assert small.baseline["accuracy"] == full.baseline["accuracy"]
    for a, b in zip(full.heads, small.heads):
        assert (a.layer, a.head) == (b.layer, b.head)
        assert b.delta_loss == pytest.approx(a.delta_loss, abs=loss_tol(a.loss, full.baseline["loss"], **size_of(model)))
        assert b.delta_accuracy == a.delta_accuracy and b.p_value == a.p_value
        assert b.kl == pytest.approx(a.kl, abs=loss_tol(a.loss, **size_of(model)))  # a KL is a difference of losses
        assert b.grad_importance_raw == approx(a.grad_importance_raw, **size_of(model))
    json.dumps(small.to_json(), allow_nan=False)  # the plan is strict JSON too


def test_max_memory_below_one_example_is_a_config_error(model, data):
    with pytest.raises(ConfigError, match="one example needs"):
        ablate_heads(model, data, task="lm", progress=False, attention=False, max_memory=100)


@pytest.mark.slow
def test_cli_max_memory(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import diagnose
    from diagnose.cli import _progress
    from diagnose.cli.main import cli

    monkeypatch.chdir(tmp_path)
    readings = iter(range(0, 10**6, 10))  # every reading 10 s on: a log line per step, then the totals
    monkeypatch.setattr(_progress, "CLOCK", lambda: float(next(readings)))
    torch.manual_seed(0)
    lm = Transformer(ModelConfig(kind="lm", vocab_size=12, max_len=8, n_layers=2, n_heads=2, d_model=16, init_std=0.3))
    diagnose.save_checkpoint(lm, tmp_path / "lm.pt", meta={"task": "lm"})
    torch.save({"input_ids": torch.randint(1, 12, (20, 6))}, tmp_path / "d.pt")
    run = CliRunner().invoke(cli, ["heads", "lm.pt", "--data", "d.pt", "--json", "h.json", "--max-memory", "170KB"])
    assert run.exit_code == 0, run.output
    timing = json.loads((tmp_path / "h.json").read_text())["timing"]
    assert timing["memory_plan"]["max_memory_bytes"] == 170 * 1024 and timing["micro_batch"] < 20
    assert f"micro-batch {timing['micro_batch']}" in run.stdout
    assert run.stderr.splitlines()[-1].startswith("ablating heads: ")  # not a terminal: a plain log line
    bad = CliRunner().invoke(cli, ["heads", "lm.pt", "--data", "d.pt", "--max-memory", "lots"])
    assert bad.exit_code == 2 and "--max-memory 'lots' is not a size" in bad.stderr
    assert "Traceback" not in bad.output
