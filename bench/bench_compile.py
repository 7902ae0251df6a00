"""TrainingMonitor under torch.compile: compile time and step time, with and without the monitor.

Two identical reference models, each wrapped in torch.compile; one is watched by
TrainingMonitor(torch.compile(model), every=1, attention_every=10). Reported:
- compile: the wall time of the first two steps (the monitored model compiles its two graphs
  there: with attention statistics on step 0, without on step 1; the plain one compiles one),
  and the graphs, recompiles and graph breaks dynamo counted for each;
- steady state: repetitions of --steps steps, interleaved (plain, monitored, plain, ...), each
  monitored time divided by the plain time of the same repetition; the median ratio, for
  wall-clock and this process's CPU time.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_compile.py [--reps 9] [--steps 20] [--d-model 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

from diagnose.monitor import TrainingMonitor  # noqa: E402
from diagnose.zoo import ModelConfig, Transformer  # noqa: E402


class Watched(Transformer):
    """The monitored variant's own class: dynamo reuses a graph across instances of one class (their
    parameters are graph inputs, hooks are not guarded), so a second Transformer would run the
    plain one's graph, without the monitor's hooks (the monitor warns when that happens)."""


def _loop(net, opt, monitor, batches):
    for ids in batches:
        logits = net(ids)  # [B, T, V]
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        if monitor is not None:
            monitor.step(loss, optimizer=opt)
        opt.step()
        opt.zero_grad(set_to_none=True)


def _counted(fn) -> tuple[float, dict[str, int]]:
    """Wall time of fn() and what dynamo counted during it."""
    before = (counters["stats"]["unique_graphs"], sum(counters["recompiles"].values()),
              sum(counters["graph_break"].values()))
    t = time.perf_counter()
    fn()
    wall = time.perf_counter() - t
    after = (counters["stats"]["unique_graphs"], sum(counters["recompiles"].values()),
             sum(counters["graph_break"].values()))
    return wall, dict(zip(("graphs", "recompiles", "graph_breaks"), (a - b for a, b in zip(after, before))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    cfg = ModelConfig(n_layers=a.layers, n_heads=4, d_model=a.d_model, max_len=32, vocab_size=64)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 64, (8, 32), generator=gen) for _ in range(a.steps)]  # [B, T] each
    variants = {}
    for name in ("plain", "monitored"):
        torch.manual_seed(0)
        model = (Watched if name == "monitored" else Transformer)(cfg)
        net = torch.compile(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        monitor = (TrainingMonitor(net, tempfile.mkdtemp(), every=1, attention_every=10, echo=False)
                   if name == "monitored" else None)
        wall, counted = _counted(lambda: _loop(net, opt, monitor, batches[:2]))
        print(f"{name:9s} first two steps (compile) {wall:6.1f} s  {counted}")
        variants[name] = (net, opt, monitor)
    ratios, cpu_ratios = [], []
    for _ in range(a.reps):
        times = {}
        for name, (net, opt, monitor) in variants.items():
            w, c = time.perf_counter(), time.process_time()
            _counted_run = _counted(lambda: _loop(net, opt, monitor, batches))
            times[name] = (time.perf_counter() - w, time.process_time() - c, _counted_run[1])
        ratios.append(times["monitored"][0] / times["plain"][0])
        cpu_ratios.append(times["monitored"][1] / times["plain"][1])
        assert all(v == 0 for t in times.values() for v in t[2].values()), f"recompiled in steady state: {times}"
    plain_ms = 1000 * times["plain"][0] / a.steps
    print(f"steady state: plain {plain_ms:.2f} ms/step; monitored/plain median wall {statistics.median(ratios):.3f} "
          f"cpu {statistics.median(cpu_ratios):.3f} over {a.reps} interleaved repetitions of {a.steps} steps; "
          f"no graph or recompile after the first two steps; load average {os.getloadavg()[0]:.1f}")
    variants["monitored"][2].close()


if __name__ == "__main__":
    main()
