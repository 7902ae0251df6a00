"""Under torchrun, an error every rank meets is said once, by rank 0, and no other rank exits
before it has: torchrun stops all workers as soon as one exits with an error, so a rank 1 that
left first used to cut rank 0 off before its line (CI, 2026-12-02: the error line was missing).

The ranks here are real processes talking to a real TCPStore, as torchrun's agent serves it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

pytestmark = [pytest.mark.numerics, pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed")]

RANK = """
import pathlib, sys, time
from diagnose._distributed import say_on_rank0
said = pathlib.Path(sys.argv[3])
time.sleep(float(sys.argv[1]))
def say():
    print("error: said", file=sys.stderr, flush=True)
    said.write_text("said")
say_on_rank0(say, wait=float(sys.argv[2]))
print("after rank 0" if said.exists() else "before rank 0")
"""


def _launcher():
    """A store as torchrun's agent holds it, and the environment its workers get."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
           "TORCHELASTIC_USE_AGENT_STORE": "True", "OMP_NUM_THREADS": "1"}
    return store, env


def _rank(env: dict, rank: int, said: Path, delay: float, wait: float = 60.0) -> subprocess.Popen:
    """A worker that sleeps `delay` s, then meets an error; rank 0 says it by printing and writing `said`."""
    return subprocess.Popen([sys.executable, "-c", RANK, str(delay), str(wait), str(said)],
                            env={**env, "RANK": str(rank)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_rank_one_waits_until_rank_zero_has_said_the_error(tmp_path):
    store, env = _launcher()
    said = tmp_path / "said"
    slow_zero, quick_one = _rank(env, 0, said, delay=2.0), _rank(env, 1, said, delay=0.0)
    out1, err1 = quick_one.communicate(timeout=120)
    out0, err0 = slow_zero.communicate(timeout=120)
    assert err0.splitlines().count("error: said") == 1 and err1 == "", (err0, err1)  # one line, rank 0's
    assert out1.strip() == "after rank 0", (out1, err1)


def test_rank_one_stops_waiting_when_rank_zero_never_says(tmp_path):
    store, env = _launcher()
    proc = _rank(env, 1, tmp_path / "said", delay=0.0, wait=1.0)
    out, err = proc.communicate(timeout=120)  # gives up after its wait
    assert (proc.returncode, out.strip(), err) == (0, "before rank 0", "")


def test_without_a_launcher_store_rank_zero_says_and_the_others_return(monkeypatch):
    from diagnose._distributed import say_on_rank0

    said = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)  # torch < 2.5, before the group is joined
    for rank in ("1", "0"):
        monkeypatch.setenv("RANK", rank)
        say_on_rank0(lambda r=rank: said.append(r))
    assert said == ["0"]
