"""`diagnose heads` under torchrun: N processes x 1 thread against 1 process x 1 thread.

The same CLI command on the same checkpoint and data, once plain and once under
`torchrun --standalone --nproc-per-node N`, interleaved `--repeats` times so that load on a
shared machine hits both. Prints the wall time of each command (imports and loading
included: what a user waits for) and the sweep's own `timing.seconds` from the JSON, the
ratios, and the largest difference between the two JSON files (delta loss, delta accuracy,
p-values), which must be about 1e-7 (float32 rounding) and 0.

On a busy machine the wall times say more about the other jobs than about the sweep, so each
process also records the CPU time it used (user + system, imports included); with one core
per process, as on a quiet machine with N cores, the N-process run takes as long as its
busiest rank (plus torchrun's own agent): "CPU-time speed-up" = one process's CPU time / that. Trust the
wall-time ratio only when the load average stays under the number of cores.

Model: the reference Transformer (diagnose.zoo), 6 layers x 8 heads, d_model 256, vocabulary
512, random init; data: 192 sequences of 64 tokens, language modelling, batch 16 (12 batches,
6 per rank), attention statistics on (the CLI's default). Each process also pays its imports
and loading (about 5 CPU seconds) and torchrun its own launcher: the bigger the sweep, the
closer the speed-up gets to N.

Run: .venv/bin/python bench/bench_distributed.py [--nproc 2] [--repeats 2] [--threads 1]
(about 3 minutes per repeat on a quiet 2-core machine). Report `uptime`'s load average with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import diagnose
from diagnose.zoo import ModelConfig, Transformer


def make_files(folder: Path, args) -> list[str]:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(kind="lm", vocab_size=args.vocab, max_len=args.length, n_layers=args.layers,
                                    n_heads=args.heads, d_model=args.d_model, init_std=0.2))
    diagnose.save_checkpoint(model, folder / "model.pt", meta={"task": "lm"})
    ids = torch.randint(1, args.vocab, (args.examples, args.length), generator=torch.Generator().manual_seed(1))
    torch.save({"input_ids": ids}, folder / "data.pt")
    return [str(Path(__file__).resolve()), "--as-cli", "heads", "model.pt", "--data", "data.pt", "--batch-size", str(args.batch_size)]


def run(cmd: list[str], folder: Path, threads: int, out: str) -> tuple[float, tuple[float, float], dict]:
    """(wall seconds, CPU seconds of the critical path, the JSON) of one command: the critical path is the
    busiest rank plus whatever else ran (torchrun's own agent), counted in full."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    for old in folder.glob("cpu.*.json"):
        old.unlink()
    before = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run([*cmd, "--json", out], cwd=folder, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    ranks = [json.loads(f.read_text()) for f in folder.glob("cpu.*.json")]
    agent = max(0.0, _children_cpu() - before - sum(ranks))
    return wall, (max(ranks), agent), json.loads((folder / out).read_text())


def _children_cpu() -> float:
    import resource

    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def as_cli(argv: list[str]) -> None:
    """Run `diagnose ARGS` in this process and, at exit, write its CPU seconds to cpu.RANK.json."""
    import atexit
    import resource

    def record() -> None:
        use = resource.getrusage(resource.RUSAGE_SELF)
        Path(f"cpu.{os.environ.get('RANK', '0')}.json").write_text(json.dumps(use.ru_utime + use.ru_stime))

    atexit.register(record)
    sys.argv = ["diagnose", *argv]
    from diagnose.cli.main import main as cli_main

    cli_main()


def largest_differences(a: dict, b: dict) -> dict[str, float]:
    out = {}
    for key in ("delta_loss", "delta_accuracy", "p_value", "p_value_loss"):
        out[key] = max(abs(x[key] - y[key]) for x, y in zip(a["heads"], b["heads"]))
    out["flags differ"] = float([f["kind"] for f in a["flags"]] != [f["kind"] for f in b["flags"]])
    return out


def main() -> None:
    if sys.argv[1:2] == ["--as-cli"]:
        return as_cli(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="threads per process, both sides")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--examples", type=int, default=192)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cli = make_files(folder, args)
        one_cmd = [sys.executable, *cli]
        many_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                    str(args.nproc), *cli]
        times: dict[str, list[tuple[float, float, float]]] = {"one": [], "many": []}
        for i in range(args.repeats):
            for side, cmd in (("one", one_cmd), ("many", many_cmd))[:: 1 if i % 2 == 0 else -1]:
                wall, (rank, agent), result = run(cmd, folder, args.threads, f"{side}.json")
                times[side].append((wall, result["timing"]["seconds"], rank + agent))
                print(f"repeat {i + 1}: {side:4} wall {wall:6.1f} s, sweep {result['timing']['seconds']:6.1f} s, "
                      f"CPU: busiest rank {rank:6.1f} s + launcher {agent:4.1f} s (load {os.getloadavg()[0]:.2f})",
                      flush=True)
        a = json.loads((folder / "one.json").read_text())
        b = json.loads((folder / "many.json").read_text())
    walls = {k: statistics.median(w for w, _, _ in v) for k, v in times.items()}
    sweeps = {k: statistics.median(s for _, s, _ in v) for k, v in times.items()}
    cpus = {k: statistics.median(c for _, _, c in v) for k, v in times.items()}
    print(f"\n{args.layers} layers x {args.heads} heads, d_model {args.d_model}, {args.examples} x {args.length} "
          f"tokens, batch {args.batch_size}; {args.threads} thread(s) per process; median of {args.repeats}")
    print(f"1 process:      wall {walls['one']:.1f} s, sweep {sweeps['one']:.1f} s, CPU {cpus['one']:.1f} s")
    print(f"{args.nproc} processes:    wall {walls['many']:.1f} s, sweep {sweeps['many']:.1f} s, "
          f"CPU of the busiest rank + agent {cpus['many']:.1f} s")
    print(f"speed-up (goal >= 1.6x for 2): wall {walls['one'] / walls['many']:.2f}x, "
          f"sweep {sweeps['one'] / sweeps['many']:.2f}x, CPU time {cpus['one'] / cpus['many']:.2f}x")
    print("largest differences, 1 vs N processes: " +
          ", ".join(f"{k} {v:.2g}" for k, v in largest_differences(a, b).items()))
    print(f"load average now: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
