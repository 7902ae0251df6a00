"""The cost of circuits (issue 34 item 6): edge attribution over every edge, exact path patching of the
top 50, against one clean forward and backward, one exact head sweep, and the naive loop of one patched
forward per edge.

Model: bench_ablation's GPT-2 (6 layers, 8 heads, d_model 256, eager), trained 10 steps; data: N repeated
random sequences of 64 tokens, task lm, batches of 32, one thread. Per repeat, in one process:
- one clean forward and backward of the loss over the data (the unit EAP is measured in);
- `find_circuit(top=50)`: EAP over every edge (timing["attribution_s"]), the top 50 patched exactly,
  8 edges per forward (timing["exact_s"]);
- the same 50 edges patched one per forward (the naive loop), through the same Patcher;
- `ablate_heads(direct=False)`: one exact head sweep (its ablation seconds).
TransformerLens 4.3 has activation patching (transformer_lens.patching) but no path patching between
heads' q/k/v inputs, so the naive loop is the baseline.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_circuit.py [--n 32] [--repeats 1]
"""

from __future__ import annotations

import argparse
import time

import torch

import bench_ablation as ba
from diagnose import find_circuit
from diagnose.ablation import ablate_heads
from diagnose.circuit import patch


def clean_pass(model, batches) -> float:
    """Seconds of one forward and backward of the summed loss per batch."""
    t0 = time.perf_counter()
    for inputs, _ in batches:
        ids = inputs["input_ids"]
        out = model(ids).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def naive(model, batches, edges) -> float:
    """Seconds of the same edges patched one forward each (PER_FORWARD = 1), find_circuit's own exact part."""
    was, patch.PER_FORWARD = patch.PER_FORWARD, 1
    try:
        return find_circuit(model, batches, task="lm", top=len(edges), resamples=0, n_boot=10).timing["exact_s"]
    finally:
        patch.PER_FORWARD = was


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = ba.gpt2(10).eval()
    ids = ba.repeat_data(args.n, seed=2)
    batches = [({"input_ids": ids[i:i + 32]}, None) for i in range(0, args.n, 32)]
    for r in range(args.repeats):
        unit = clean_pass(model, batches)
        res = find_circuit(model, batches, task="lm", top=50, resamples=0, n_boot=200)
        t = res.timing
        loop = naive(model, batches, res.edges)
        sweep = ablate_heads(model, batches, task="lm", attention=False, direct=False).timing["ablation_seconds"]
        print(f"repeat {r}: {res.n_edges} edges; clean forward+backward {unit:.2f} s; EAP over every edge "
              f"{t['attribution_s']:.2f} s = {t['attribution_s'] / unit:.2f}x; exact top 50 {t['exact_s']:.1f} s "
              f"({t['forwards']} forwards) vs one head sweep {sweep:.1f} s = {t['exact_s'] / sweep:.2f}x; the naive "
              f"one forward per edge {loop:.1f} s; whole call {t['total_s']:.1f} s; "
              f"Spearman EAP vs exact {res.attribution['spearman_vs_exact']}", flush=True)


if __name__ == "__main__":
    main()
