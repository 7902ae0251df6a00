"""Under torchrun, an error every rank meets is said once, by rank 0, and no other rank exits
before it has: torchrun stops all workers as soon as one exits with an error, so a rank 1 that
left first used to cut rank 0 off before its line (CI, 2026-12-02: the error line was missing).

The ranks here are real processes talking to a real TCPStore, as torchrun's agent serves it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed")

RANK = """
import sys, time
from diagnose._distributed import say_on_rank0
time.sleep(float(sys.argv[1]))
say_on_rank0(lambda: print("error: said", time.time(), file=sys.stderr, flush=True), wait=float(sys.argv[2]))
print(time.time())
"""


def _launcher():
    """A store as torchrun's agent holds it, and the environment its workers get."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
           "OMP_NUM_THREADS": "1"}
    return store, env


def _rank(env: dict, rank: int, delay: float, wait: float = 60.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RANK, str(delay), str(wait)], env={**env, "RANK": str(rank)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_rank_one_waits_until_rank_zero_has_said_the_error():
    store, env = _launcher()
    slow_zero, quick_one = _rank(env, 0, delay=2.0), _rank(env, 1, delay=0.0)
    out1, err1 = quick_one.communicate(timeout=120)
    out0, err0 = slow_zero.communicate(timeout=120)
    said = [x for x in err0.splitlines() if x.startswith("error: said")]
    assert len(said) == 1 and err1 == "", (err0, err1)  # one line, from rank 0 only
    assert float(out1) >= float(said[0].split()[-1])  # rank 1 returned only after rank 0's line


def test_rank_one_stops_waiting_when_rank_zero_never_says():
    store, env = _launcher()
    start = time.time()
    out, err = _rank(env, 1, delay=0.0, wait=1.0).communicate(timeout=120)
    assert err == "" and float(out) - start < 60  # gave up after its wait, printed nothing


def test_without_a_launcher_store_rank_zero_says_and_the_others_return(monkeypatch):
    from diagnose._distributed import say_on_rank0

    said = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    for rank in ("1", "0"):
        monkeypatch.setenv("RANK", rank)
        say_on_rank0(lambda r=rank: said.append(r))
    assert said == ["0"]
