"""Resample ablation's cost against a zero sweep at the same settings (issue 23, goal <= 3x).

Model and data: bench_ablation.py's (a 6-layer, 8-head HF GPT-2, d_model 256, trained 10 steps; task lm,
sequences of 64 tokens, random halves repeated). Both sides: ablate_heads over the same batches, every
head exactly, attention=False, the same batch size; resample with its default draws (2) and with
--draws. The two sides alternate, best of --repeats each, so that the machine's load hits both; the
ratio is resample / zero. Resample's extra work is one data pass that records a donor pool's head outputs,
then `draws` forwards per ablation instead of one. --methods also times `ablate_methods(zero, mean,
resample)`, one sweep sharing the clean passes and prefixes, against the three sweeps run apart.

Run: .venv/bin/python bench/bench_resample.py --threads 1 [--n 64] [--draws 2,4] [--repeats 2] [--methods]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from diagnose.ablation import ablate_heads, ablate_methods

sys.path.insert(0, str(Path(__file__).parent))
from bench_ablation import gpt2, repeat_data  # noqa: E402  (the ablation bench's model and data)


def timed(model, data: dict, method: str, draws: int | None, batch_size: int) -> tuple[float, int]:
    """(seconds, forward passes) of one sweep."""
    start = time.perf_counter()
    result = ablate_heads(model, data, task="lm", method=method, draws=draws, batch_size=batch_size,
                          attention=False, direct=False, progress=None)
    return time.perf_counter() - start, result.timing["forward_passes"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n", type=int, default=64, help="sequences of 64 tokens")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--draws", default="2", help="comma-separated draws for resample (default: its default, 2)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--methods", action="store_true",
                    help="also time zero, mean and resample in one shared sweep against three sweeps")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = gpt2(10)
    data = {"input_ids": repeat_data(args.n, seed=7)}
    draws = [int(d) for d in args.draws.split(",")]
    best: dict[str, tuple[float, int]] = {}
    for _ in range(args.repeats):
        for name, method, d in [("zero", "zero", None), *((f"resample x{d}", "resample", d) for d in draws)]:
            seconds, forwards = timed(model, data, method, d, args.batch_size)
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, forwards)
    zero = best["zero"][0]
    print(f"{args.n} sequences x 64 tokens, batch {args.batch_size}, {args.threads} thread(s), best of {args.repeats}")
    print("| method | seconds | forward passes | x zero |\n| --- | --- | --- | --- |")
    for name, (seconds, forwards) in best.items():
        print(f"| {name} | {seconds:.2f} | {forwards} | {seconds / zero:.2f}x |")
    if args.methods:
        shared_vs_apart(model, data, draws[0], args.batch_size, args.repeats)


def shared_vs_apart(model, data: dict, draws: int, batch_size: int, repeats: int) -> None:
    """ablate_methods(zero, mean, resample) in one sweep against the three sweeps apart, alternating."""
    names = ["zero", "mean", "resample"]
    best: dict[str, tuple[float, int]] = {}
    for _ in range(repeats):
        start = time.perf_counter()
        result = ablate_methods(model, data, names, task="lm", draws=draws, batch_size=batch_size,
                                attention=False, direct=False, progress=None)
        shared = (time.perf_counter() - start, result.timing["forward_passes"])
        apart = [timed(model, data, m, draws if m == "resample" else None, batch_size) for m in names]
        for key, value in (("shared", shared), ("apart", (sum(a[0] for a in apart), sum(a[1] for a in apart)))):
            if key not in best or value[0] < best[key][0]:
                best[key] = value
    print(f"\nzero, mean and resample (x{draws}), best of {repeats}:")
    print("| | seconds | forward passes |\n| --- | --- | --- |")
    print(f"| three sweeps apart | {best['apart'][0]:.2f} | {best['apart'][1]} |")
    print(f"| one shared sweep (--methods) | {best['shared'][0]:.2f} | {best['shared'][1]} |")
    print(f"shared / apart: {best['shared'][0] / best['apart'][0]:.2f}x time, "
          f"{best['shared'][1] / best['apart'][1]:.2f}x forward passes")


if __name__ == "__main__":
    main()
