"""Small-scale proxies of large-run instabilities (after Wortsman et al. 2023): does the monitor
name the instability, early, and stay quiet on stable runs?

A byte-level decoder (bench/_proxy.py: 2 layers, d=64, 4 heads, 64 positions, AdamW without weight
decay, 20 warmup steps) trained on the Python Language Reference that ships with CPython
(`pydoc_data.topics`), at each learning rate with and without qk-layernorm and with and without
z-loss (1e-4). Each run is compared with the matching stable run: the same lr with both cures.
Per run it prints the first alert of each instability kind (attention_logit_growth,
logit_divergence, update_size, adam_eps), the other alerts' kinds, and the first step where the
loss (mean of the last 20 steps) is 10 % above the matching stable run's and stays so to the end,
and the largest rms of the output log-partition z over the logged steps (with the mean z there),
read back from the run folder: the signal logit_divergence watches.
A run whose loss falls behind is unstable; the goal is that the alert naming its cause comes >= 50 steps earlier,
and that a run that does not fall behind raises none of these alerts.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_proxies.py [--lrs 0.003,0.03,0.1,0.3] [--steps 300]
        [--warmup 20] [--no-head-bias] [--no-ln-bias] [--eps 1e-8] [--softmax]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _proxy import corpus, train  # noqa: E402

from diagnose.monitor import read_run  # noqa: E402

CAUSES = ("attention_logit_growth", "logit_divergence", "update_size", "adam_eps")  # the new kinds
WINDOW = 20  # steps in the loss mean compared with the stable run
BEHIND = 1.10  # "10 % behind"


def smooth(losses: list[float]) -> list[float]:
    """The mean of the last WINDOW losses at each step (fewer at the start)."""
    out, acc = [], 0.0
    for i, x in enumerate(losses):
        acc += x - (losses[i - WINDOW] if i >= WINDOW else 0.0)
        out.append(acc / min(i + 1, WINDOW))
    return out


def behind_step(run: list[float], stable: list[float]) -> int | None:
    """The step from which the run's mean loss stays BEHIND x the stable run's to the end; None
    when it ends within 10 %. (A gap that closes again is the early phase, where qk-norm speeds
    learning up, not an instability.)"""
    a, b = smooth(run), smooth(stable)
    start = None
    for i in range(WINDOW, len(a)):
        if a[i] <= BEHIND * b[i]:
            start = None
        elif start is None:
            start = i
    return start


def peak_z(run_dir: str) -> tuple[float, float, int]:
    """(largest rms z, mean z at that step, that step) over the run's logged steps."""
    rms, mean, step = max((r["z_sq_mean"] ** 0.5, r["z_mean"], r["step"]) for r in read_run(run_dir).records
                          if r.get("z_sq_mean") is not None)
    return rms, mean, step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lrs", default="0.003,0.03,0.1,0.3")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--attention-every", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--no-head-bias", action="store_true", help="an output layer without bias")
    ap.add_argument("--no-ln-bias", action="store_true", help="LayerNorms without bias")
    ap.add_argument("--eps", type=float, default=1e-8, help="Adam's eps")
    ap.add_argument("--softmax", action="store_true", help="attention by an explicit softmax (nanoGPT without flash)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = corpus()
    print(f"corpus: pydoc_data.topics, {len(data):,} bytes; torch {torch.__version__}; "
          f"{args.steps} steps, warmup {args.warmup}, head bias {not args.no_head_bias}, "
          f"LayerNorm bias {not args.no_ln_bias}, eps {args.eps:g}, "
          f"attention_every={args.attention_every}")
    print("| lr | qk-norm | z-loss | final loss (mean of 20) | loss 10 % behind at | first alerts of the new kinds "
          "| lead (steps) | largest rms z (mean z, step) | other alerts |")
    print("|---|---|---|---|---|---|---|---|---|")
    for lr in (float(x) for x in args.lrs.split(",")):
        runs = {}
        for qk in (True, False):
            for z in (1e-4, 0.0):
                t0 = time.perf_counter()
                with tempfile.TemporaryDirectory() as d:
                    losses, alerts = train(lr, qk_norm=qk, z_loss=z, steps=args.steps, warmup=args.warmup,
                                           head_bias=not args.no_head_bias, ln_bias=not args.no_ln_bias,
                                           eps=args.eps, monitor_dir=d,
                                           attention_every=args.attention_every, data=data, softmax=args.softmax)
                    zpeak = peak_z(d)
                runs[qk, z] = (losses, alerts, zpeak, time.perf_counter() - t0)
        stable = runs[True, 1e-4][0]
        for (qk, z), (losses, alerts, (zrms, zmean, zstep), secs) in runs.items():
            behind = behind_step(losses, stable)
            first: dict[str, int] = {}
            for step, kind in alerts:
                first.setdefault(kind, step)
            named = {k: s for k, s in first.items() if k in CAUSES}
            cause = "attention_logit_growth" if not qk else "logit_divergence" if not z else None
            lead = (behind - named[cause] if behind is not None and cause in named else None)
            others = sorted(k for k in first if k not in CAUSES)
            print(f"| {lr:g} | {'on' if qk else 'off'} | {'1e-4' if z else 'off'} | {smooth(losses)[-1]:.3f} "
                  f"| {behind if behind is not None else '-'} "
                  f"| {', '.join(f'{k} @ {s}' for k, s in named.items()) or 'none'} "
                  f"| {lead if lead is not None else '-'} | {zrms:.1f} ({zmean:+.1f}, {zstep}) "
                  f"| {', '.join(others) or 'none'} |", flush=True)
            print(f"<!-- {secs:.1f} s -->", file=sys.stderr)


if __name__ == "__main__":
    main()
