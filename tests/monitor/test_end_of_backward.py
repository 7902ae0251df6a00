"""at_end_of_backward (what the HF callback reads pre-clip gradient norms with) runs after DDP has
averaged the gradients: what it sees equals the final .grad, where a callback queued once does not."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.numerics

WORKER = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
    from diagnose.monitor._signals import at_end_of_backward

    def run(rank, init):
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        ddp = torch.nn.parallel.DistributedDataParallel(m, bucket_cap_mb=0.0001)  # several buckets
        seen = {}
        eng = torch.autograd.Variable._execution_engine
        def hook(g):
            eng.queue_callback(lambda: seen.__setitem__("once", [p.grad.clone() for p in m.parameters()]))
            at_end_of_backward(lambda: seen.__setitem__("ours", [p.grad.clone() for p in m.parameters()]))
        torch.manual_seed(rank + 1)  # each rank its own data: averaging changes the gradients
        out = ddp(torch.randn(4, 8)).sum()
        out.register_hook(hook)
        out.backward()
        final = [p.grad for p in m.parameters()]
        same = lambda k: all(torch.equal(a, b) for a, b in zip(seen[k], final))
        print(f"rank{rank} ours={same('ours')} once={same('once')}", flush=True)
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(run, args=(sys.argv[1],), nprocs=2)
""")


@pytest.mark.slow
def test_end_of_backward_sees_ddp_averaged_grads(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    init = f"file://{tmp_path / 'rendezvous'}"
    out = subprocess.run([sys.executable, str(script), init], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for rank in (0, 1):
        assert f"rank{rank} ours=True once=False" in out.stdout, out.stdout
