"""`diagnose circuit` under torchrun (2 CPU ranks, gloo): each rank measures a shard of the examples and
rank 0 writes the JSON one process gives, up to the tolerance policy (tests/tolerance.py) for the
planted model's float32 forwards; rank 1 prints nothing."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from diagnose import find_circuit, save_checkpoint
from ..ablation.test_distributed import _HANGS_ON_2_4, _close, _group
from ..tolerance import size_of
from .planted import planted, planted_data

pytestmark = pytest.mark.numerics

# 12 examples in batches of 4: rank 0 holds two, rank 1 one; mean's data pass and the attribution add up
ARGS = ["--batch-size", "4", "--methods", "zero,mean", "--top", "4", "--estimator", "eap-ig"]


@pytest.mark.slow
@_HANGS_ON_2_4
def test_torchrun_gives_the_json_of_one_process(tmp_path):
    model, data = planted("relay"), planted_data("relay", n=12, wrong=True)
    save_checkpoint(model, tmp_path / "model.pt", meta={"task": "lm"})
    torch.save(data, tmp_path / "eval.pt")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    two = _group([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
                  "diagnose", "circuit", "model.pt", "--data", "eval.pt", *ARGS, "--json", "two.json"],
                 cwd=tmp_path, env=env)
    assert two.returncode == 0, two.stderr
    assert two.stdout.count("Circuit edges (path patching)") == 1  # rank 1 is quiet
    many = json.loads((tmp_path / "two.json").read_text())
    one = json.loads(json.dumps(find_circuit(model, data, task="lm", batch_size=4, methods=["zero", "mean"], top=4,
                                             estimator="eap-ig").to_json()))
    assert (one["timing"]["ranks"], many["timing"]["ranks"]) == (1, 2)
    # sharded, not repeated: the two ranks' patched forwards add up to one process's (each its own batches)
    assert many["timing"]["forwards"] == one["timing"]["forwards"]
    one.pop("timing"), many.pop("timing")
    # the attribution's list past the planted edges ranks near-zero estimates: compared by edge, not by place
    for doc in (one, many):
        doc["attribution"]["top"] = {e["label"]: e for e in doc["attribution"]["top"]}
    _close(one, many, tol=size_of(model))
    assert {e["label"] for e in many["circuit"]["edges"]} == {"L0.H0 -> L1.H0 (k)", "L1.H0 -> MLP1", "MLP1 -> output"}
