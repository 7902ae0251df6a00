"""The cost of direct effects (issue 23 item 6): every head's direct effect against one zero sweep.

Model: bench_ablation's issue-14 GPT-2 (6 layers, 8 heads, d_model 256, eager), trained 10 steps, with
vocabulary 512 (the ablation bench's) or, with --vocab 50257, GPT-2's own output layer, where the output
layers that direct effects rerun per head cost most. Data: N sequences of 64 tokens, task lm, batches
of 32. Each repeat runs, back to back in one process, `ablate_heads(direct=False)` (the zero sweep) and
`ablate_heads(direct=True)`; it prints the direct effects' own seconds (result.direct["seconds"]: one
clean pass per batch plus the output layers per head) over the sweep's ablation seconds, and the whole
call with direct effects over the whole call without.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_direct.py [--n 64] [--repeats 2] [--vocab 512]
"""

from __future__ import annotations

import argparse
import time

import torch

import bench_ablation as ba
from diagnose.ablation import ablate_heads


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=ba.V)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ba.V = args.vocab
    model = ba.gpt2(10)
    ids = ba.repeat_data(args.n, seed=2)
    batches = [({"input_ids": ids[i:i + 32]}, None) for i in range(0, args.n, 32)]
    for r in range(args.repeats):
        t0 = time.perf_counter()
        off = ablate_heads(model, batches, task="lm", attention=False, direct=False)
        t1 = time.perf_counter()
        on = ablate_heads(model, batches, task="lm", attention=False, direct=True)
        t2 = time.perf_counter()
        d = on.direct
        print(f"repeat {r}: zero sweep {off.timing['ablation_seconds']:.1f} s (call {t1 - t0:.1f} s); direct effects "
              f"of {d['n_heads']} heads {d['seconds']:.1f} s, {d['forward_passes']} forwards = "
              f"{d['seconds'] / off.timing['ablation_seconds']:.2f}x the sweep; call with direct {t2 - t1:.1f} s = "
              f"{(t2 - t1) / (t1 - t0):.2f}x the call without", flush=True)
    top = max(on.heads, key=lambda h: h.delta_loss)
    print(f"largest total effect {top.layer}.{top.head}: delta_loss {top.delta_loss:+.4f}, direct "
          f"{top.direct_delta_loss:+.4f}, self_repair {top.self_repair:+.4f}")


if __name__ == "__main__":
    main()
