"""Sweeps sharded over torch.distributed ranks (gloo on the CPU) give what one process gives:
the same per-head effects (within the tolerance policy), p-values, intervals and flags; a failure on one rank
stops every rank instead of leaving the others waiting; under torchrun only rank 0 prints and
writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import diagnose
from diagnose._distributed import Ranks
from diagnose.ablation import ablate_heads

from . import ranks as workers
from ..versions import torch_before
from ..tolerance import F64, approx, size_of

pytestmark = pytest.mark.numerics

ROOT = Path(__file__).resolve().parents[2]
SIZE = size_of(workers.model())  # the workers' model: their float32 forwards round like it
TIMEOUT = 240  # seconds for a whole group (imports included) on a busy machine; a hang fails, not waits
# On torch 2.4 (the version matrix's lowest row) both multi-process sweeps below hung past TIMEOUT inside
# the full suite, twice, though each passes alone in 30 s; not diagnosed, so not claimed: they run from 2.5.
_HANGS_ON_2_4 = pytest.mark.skipif(torch_before(2, 5), reason="multi-process sweeps hung inside the suite on "
                                   "torch 2.4 (docs/development.md, version matrix)")


def _same(one: dict, many: dict) -> None:
    """The JSON of a sharded sweep against one process's: every number of every head, the tests, the flags."""
    assert many["n_examples"] == one["n_examples"] and many["n_units"] == one["n_units"]
    assert many["timing"]["batches"] == one["timing"]["batches"]
    for a, b in zip(one["heads"], many["heads"], strict=True):
        assert (a["layer"], a["head"], a["verified"], a["significant"]) == (b["layer"], b["head"], b["verified"],
                                                                              b["significant"])
        # effects: float32 forwards of another replica count (each rank checks prefix replay on its first
        # batch) round differently in the last bits; tests and decisions must not move at all
        for k in ("accuracy", "delta_accuracy", "loss", "delta_loss", "kl", "grad_importance", "grad_importance_raw",
                  "estimated_delta_loss", "second_order_delta_loss", "delta_accuracy_ci", "delta_loss_ci",
                  "direct_delta_loss", "direct_delta_accuracy", "direct_delta_loss_ci", "self_repair"):
            _close(a[k], b[k], k, tol=SIZE)
        for k in ("p_value", "p_value_adjusted", "p_value_loss", "p_value_loss_adjusted", "role", "negligible",
                  "direct_p_value_loss", "direct_p_value_loss_adjusted", "direct_significant", "compensated"):
            _close(a[k], b[k], k)
        _close(a["attention"], b["attention"], "attention")
    assert [(f["kind"], f.get("layer"), f.get("head")) for f in many["flags"]] == \
        [(f["kind"], f.get("layer"), f.get("head")) for f in one["flags"]]
    _close(one["correlations"], many["correlations"])
    _close(one["together"], many["together"])
    _close(one["baseline"], many["baseline"])
    assert many["examples"] == one["examples"]
    assert (many["direct"] or {}).get("n_heads") == (one["direct"] or {}).get("n_heads")


def _close(a, b, path="", tol=None) -> None:
    """Nested JSON equal, floats within the policy's tolerance relative to their magnitude (at least 1):
    float64 statistics by default, float32 forwards of the workers' model (`tol=SIZE`)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}", tol)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]", tol)
    elif isinstance(a, float) and not isinstance(b, bool):
        size = tol or {"dtype": F64}
        assert isinstance(b, float) and a == approx(b, scale=max(1.0, abs(a)), **size), (path, a, b)
    else:
        assert a == b, path


def _start(rank: int, world: int, store: Path, out: Path) -> subprocess.Popen:
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tests.ablation.ranks import worker; "
            f"worker({rank}, {world}, {str(store)!r}, {str(out)!r}, {torch.get_num_threads()})")
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
@_HANGS_ON_2_4
def test_two_ranks_give_the_json_of_one_process(tmp_path):
    procs = [_start(r, 2, tmp_path / "store", tmp_path) for r in range(2)]
    try:
        logs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    finally:  # a hang fails the test without leaving the workers behind
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], logs
    for name, kw in workers.SETTINGS.items():
        one = ablate_heads(workers.model(), workers.data(), progress=False, **kw).to_json()
        parts = [json.loads((tmp_path / f"{name}.{r}.json").read_text()) for r in range(2)]
        assert parts[0]["timing"]["ranks"] == 2 and one["timing"]["ranks"] == 1
        # each rank checks prefix replay once per layer on its first batch: a few examples more in all
        assert one["timing"]["examples_forwarded"] <= parts[0]["timing"]["examples_forwarded"]
        for part in parts:  # every rank returns the whole result
            _same(one, part)
    errors = [json.loads((tmp_path / f"error.{r}.json").read_text()) for r in range(2)]
    assert errors[1].startswith("RuntimeError: out of memory on this rank"), errors  # its own error
    assert errors[0].startswith("DistributedError: rank 1 of 2 failed while ablating heads"), errors
    assert "out of memory on this rank" in errors[0]


def _kill_in(folder) -> None:
    """Kill every process of ours whose working folder is `folder` (Linux /proc; elsewhere nothing)."""
    for entry in Path("/proc").glob("[0-9]*") if folder is not None else []:
        try:
            if os.readlink(entry / "cwd") == str(folder) and int(entry.name) != os.getpid():
                os.kill(int(entry.name), 9)
        except OSError:
            continue


def _group(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """subprocess.run in a session of its own: on a timeout the whole group goes (torchrun's workers
    too, which killing the launcher alone leaves running), and the test fails."""
    with subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **kw) as proc:
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            _kill_in(kw.get("cwd"))  # torchrun starts its workers in sessions of their own
            proc.communicate()
            pytest.fail(f"{' '.join(cmd[:6])} ... did not finish in {TIMEOUT} s; its process group was killed")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.slow
@_HANGS_ON_2_4
def test_torchrun_cli_writes_the_json_of_one_process_from_rank_0(tmp_path):
    torch.manual_seed(0)
    lm = diagnose.zoo.Transformer(diagnose.zoo.ModelConfig(kind="lm", vocab_size=12, max_len=8, n_layers=2,
                                                           n_heads=2, d_model=16, init_std=0.3))
    diagnose.save_checkpoint(lm, tmp_path / "lm.pt", meta={"task": "lm"})
    ids = torch.randint(1, 12, (20, 6))  # [N, T]
    mask = torch.ones(20, 6, dtype=torch.long)
    mask[::2, 4:] = 0
    torch.save({"input_ids": ids, "attention_mask": mask}, tmp_path / "data.pt")
    args = ["heads", "lm.pt", "--data", "data.pt", "--batch-size", "4", "--together", "L0.H0,L1.H1"]
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    one = _group([sys.executable, "-m", "diagnose", *args, "--json", "one.json"], cwd=tmp_path, env=env)
    assert one.returncode == 0, one.stderr
    many = _group([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   "-m", "diagnose", *args, "--json", "two.json"], cwd=tmp_path, env=env)
    assert many.returncode == 0, many.stderr
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "two.json"))
    _same(a, b)
    assert b["timing"]["ranks"] == 2
    assert many.stdout.count("heads tested matter") == 1  # rank 1 is quiet
    bad = _group([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                  "-m", "diagnose", "heads", "lm.pt", "--data", "missing.pt"], cwd=tmp_path, env=env)
    assert bad.returncode != 0 and bad.stderr.count("error: ") == 1 and "missing.pt" in bad.stderr, bad.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.pt", "lm.pt", "one.json", "two.json"]


def test_shards_are_contiguous_and_cover_everything():
    for n in range(0, 9):
        for world in (1, 2, 3, 5):
            got = [list(Ranks(r, world).shard(n)) for r in range(world)]
            assert sum(got, []) == list(range(n))
            assert max(map(len, got)) - min(map(len, got)) <= 1


def test_distributed_true_without_a_group_is_a_clean_error():
    from diagnose.errors import ConfigError

    with pytest.raises(ConfigError, match="init_process_group"):
        ablate_heads(workers.model(), workers.data(), task="lm", progress=False, distributed=True)
