"""Under DDP and under FSDP2 (`fully_shard`, gradients sharded across ranks), with gloo and 2
processes, the logged statistics equal one process on the global batch, and only rank 0 writes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from diagnose.monitor import TrainingMonitor, read_run
from diagnose.zoo import ModelConfig, Transformer

from ..tolerance import approx, magnitude
from ..versions import torch_before

pytestmark = pytest.mark.numerics

CFG = dict(n_layers=2, n_heads=2, d_model=16, max_len=8, vocab_size=11)
STEPS = 3

WORKER = textwrap.dedent("""
    import sys, torch, torch.distributed as dist, torch.nn.functional as F
    torch.set_num_threads(1)
    from torch.nn.parallel import DistributedDataParallel as DDP
    from diagnose.monitor import TrainingMonitor
    from diagnose.zoo import ModelConfig, Transformer
    rank, init, run_dir, cfg, steps = int(sys.argv[1]), sys.argv[2], sys.argv[3], eval(sys.argv[4]), int(sys.argv[5])
    wrap = sys.argv[6]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**cfg))
    if wrap == "ddp":
        model = DDP(model)
    else:  # FSDP2: every block, then the root, sharded across the two ranks
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = TrainingMonitor(model, run_dir if rank == 0 else run_dir + "-rank1", attention_every=1, every=1, echo=False)
    for s in range(steps):
        ids = torch.randint(1, 11, (8, 8), generator=torch.Generator().manual_seed(s))[rank * 4:(rank + 1) * 4]
        loss = F.cross_entropy(model(ids)[:, :-1].reshape(-1, 11), ids[:, 1:].reshape(-1))
        loss.backward()
        mon.step(loss, optimizer=opt)
        opt.step(); opt.zero_grad()
    mon.close()
    dist.barrier()  # both ranks done before gloo tears down (else an occasional abort at exit)
    dist.destroy_process_group()
""")


def _single(run_dir):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**CFG))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with TrainingMonitor(model, run_dir, attention_every=1, every=1, echo=False) as mon:
        for s in range(STEPS):
            ids = torch.randint(1, 11, (8, 8), generator=torch.Generator().manual_seed(s))  # the global batch
            loss = F.cross_entropy(model(ids)[:, :-1].reshape(-1, 11), ids[:, 1:].reshape(-1))
            loss.backward()
            mon.step(loss, optimizer=opt)
            opt.step()
            opt.zero_grad()
    return read_run(run_dir)


_FSDP2 = pytest.param("fsdp2", marks=pytest.mark.skipif(
    torch_before(2, 6), reason="torch.distributed.fsdp.fully_shard (FSDP2) arrived in torch 2.6"))


@pytest.mark.slow
@pytest.mark.parametrize("wrap", ["ddp", _FSDP2])
def test_two_ranks_match_single_process(tmp_path, wrap):
    run_dir = str(tmp_path / wrap)
    init = f"file://{tmp_path / 'init'}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), init, run_dir, repr(CFG), str(STEPS), wrap],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert not os.path.exists(run_dir + "-rank1")  # only rank 0 writes
    ddp = read_run(run_dir)
    single = _single(tmp_path / "single")
    assert ddp.info["settings"]["world_size"] == 2 and ddp.info["model"]["blocks"] == ["blocks.0", "blocks.1"]
    cols = ["loss", "grad_norm"] + [f"layers/blocks.{i}/{f}" for i in range(2)
                                    for f in ("grad_norm", "act_mean", "act_var", "act_max_abs", "token_cos")]
    # float32 computed two ways (two half batches and an all-reduce vs the global batch, over
    # STEPS SGD steps): the model's depth; d_model wide, but a gradient norm sums the squares of
    # the largest parameter in float32. Each column's scale is the size of the values it sums.
    model = Transformer(ModelConfig(**CFG))
    depth, d_model = CFG["n_layers"], CFG["d_model"]
    norm_width = max(p.numel() for p in model.parameters())
    big = magnitude(single.steps[[f"layers/blocks.{i}/act_max_abs" for i in range(2)]].to_numpy())
    for col in cols:
        want = single.steps[col].tolist()
        kind = col.rsplit("/", 1)[-1]
        width = norm_width if kind == "grad_norm" else d_model
        scale = {"act_mean": big, "act_var": big ** 2, "token_cos": 1.0}.get(kind, max(1.0, magnitude(want)))
        assert ddp.steps[col].tolist() == approx(want, scale=scale, depth=depth, width=width), col
    want = single.attention["entropy"].tolist()  # sums of -p log p over keys, then over query rows
    assert ddp.attention["entropy"].tolist() == approx(want, depth=depth, width=8 * 8), "entropy"
