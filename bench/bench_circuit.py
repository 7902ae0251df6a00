"""The cost of circuits (issue 34 item 6): edge attribution over every edge, exact path patching of the
top 50, against one clean forward and backward, one exact head sweep, and the naive loop of one patched
forward per edge.

Model: bench_ablation's GPT-2 (6 layers, 8 heads, d_model 256, eager), trained 10 steps, each layer's MLP a
node (--no-mlps: heads only); data: N repeated random sequences of 64 tokens, task lm, batches of 32, one
thread. Per repeat, in one process:
- one clean forward and backward of the loss over the data (the unit EAP is measured in);
- EAP over every edge (find_circuit's attribution), then the 50 edges it ranks first patched exactly as
  find_circuit does (the head sweep's plan: micro-batches and replicas per forward that keep a forward in a
  CPU's cache; the clean prefix replayed), and the same 50 one per forward on the whole batch (the naive loop);
- `ablate_heads(direct=False)`: one exact head sweep (its ablation seconds).
TransformerLens 4.3 has activation patching (transformer_lens.patching) but no path patching between
heads' q/k/v inputs, so the naive loop is the baseline.

Run: cd bench && OMP_NUM_THREADS=1 ../.venv/bin/python bench_circuit.py [--n 32] [--repeats 1] [--top 50] [--no-mlps]
"""

from __future__ import annotations

import argparse
import time

import torch

import bench_ablation as ba
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


def parts(model, batches, top: int, mlps: bool = True):
    """(edges, seconds of EAP over every edge, of the top edges patched 8 per forward, of the same one per
    forward, their Spearman correlation), through find_circuit's own pieces (no minimal-circuit search)."""
    from diagnose.ablation.gate import gated
    from diagnose.ablation.sweep import Sweep
    from diagnose.circuit.attribution import attribute, spearman
    from diagnose.circuit.edges import all_edges
    from diagnose.circuit.mlp import mlp_gated
    from diagnose.circuit.wiring import wiring
    from diagnose.sites import find_heads

    from diagnose.ablation.plan import micro_batches, plan_sweep

    sites = find_heads(model, example=batches[0][0])
    wired = wiring(model, sites, batches[0][0], mlps=mlps)
    with gated(sites) as gates, mlp_gated(wired.mlps) as mlp_gates:
        sweep = Sweep(model, sites, gates, "lm")  # as find_circuit: the clean prefix replays (patch.py)
        edges = all_edges(sites, [m.site.layer for m in wired.mlps])
        plan = plan_sweep(model, sites, batches, task="lm")  # as find_circuit: the head sweep's rows per forward
        patcher = patch.Patcher(sweep, wired, edges, per_forward=plan.replication, mlp_gates=mlp_gates)
        print(f"plan: {plan.describe()}", flush=True)
        t0 = time.perf_counter()
        scores = attribute(patcher, batches, "eap")
        t_eap = time.perf_counter() - t0
        chosen = torch.as_tensor(scores).abs().argsort(descending=True)[:top]
        sets = torch.zeros(top, len(edges), dtype=torch.bool)
        sets[torch.arange(top), chosen] = True
        seconds = []
        for per, parts_, reuse in ((plan.replication, micro_batches(batches, plan.micro_batch), True),
                                   (1, batches, False)):  # the naive loop: every forward in full
            patcher.per_forward, patcher.replaying = per, reuse
            t0 = time.perf_counter()
            measured = patch.over_data(patcher, parts_, sets)
            seconds.append(time.perf_counter() - t0)
        exact = (measured.set_loss - measured.loss_sum[:, None]).sum(0) / measured.count.sum()
        rho = spearman(list(scores[chosen.numpy()]), list(exact))
    return len(edges), t_eap, seconds[0], seconds[1], rho


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--top", type=int, default=50)
    ap.add_argument("--no-mlps", dest="mlps", action="store_false", help="heads-only edges (no MLP nodes)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = ba.gpt2(10).eval()
    ids = ba.repeat_data(args.n, seed=2)
    batches = [({"input_ids": ids[i:i + 32]}, None) for i in range(0, args.n, 32)]
    for r in range(args.repeats):
        unit = clean_pass(model, batches)
        n_edges, eap, exact, loop, rho = parts(model, batches, args.top, args.mlps)
        sweep = ablate_heads(model, batches, task="lm", attention=False, direct=False).timing["ablation_seconds"]
        print(f"repeat {r}: {n_edges} edges; clean forward+backward {unit:.2f} s; EAP over every edge {eap:.2f} s = "
              f"{eap / unit:.2f}x; exact top {args.top} as find_circuit {exact:.1f} s vs one head sweep {sweep:.1f} s "
              f"= {exact / sweep:.2f}x; the naive loop (one forward per edge) {loop:.1f} s = {loop / exact:.2f}x "
              f"ours; Spearman EAP vs exact over the top {args.top}: {rho}", flush=True)


if __name__ == "__main__":
    main()
