"""Exact head-ablation sweep: diagnose.ablate_heads against the batched peer loop, cell by cell.

Model (issue 14): a 6-layer, 8-head HF GPT-2 (d_model 256, vocabulary 512, eager attention),
trained for a few steps so that heads matter; 128 sequences of 64 tokens (random halves
repeated, so the second half is predictable by copying). Tasks: lm (next token) and token
classification (labels [N, T]: the copied token in the second half, -100 elsewhere).

Peer: TransformerLens 4 TransformerBridge.run_with_hooks zeroing blocks.{l}.attn.hook_z[:, :, h],
one forward per head plus one clean forward, over the SAME batches of the size passed, scoring
each forward. Ours: ablate_heads over the same list of batches (it also computes gradient
importance, KL, bootstrap CIs, p-values and flags), attention=False; with --attention-at also the
CLI default (attention statistics on), timed in the same cell. Each cell runs peer and ours back
to back (ours first on odd cells) so that the machine's load hits both; ratio = peer / ours.

Run: .venv/bin/python bench/bench_ablation.py --threads 1 [--batch-sizes 16,32,128] [--tasks lm,token]
     [--attention-at 32] [--demo]   (about 2 minutes per cell and thread on a quiet 2-core machine)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from diagnose.ablation import ablate_heads
from diagnose.objectives import IGNORE, logits_of, score, targets_for

V, T, N, L, H, C = 512, 64, 128, 6, 8, 256
TASKS = {"lm": "lm", "token": "classification"}


def repeat_data(n: int, seed: int) -> torch.Tensor:
    """Random halves repeated once: the second half is predictable by copying.  # [n, T]"""
    g = torch.Generator().manual_seed(seed)
    first = torch.randint(1, V, (n, T // 2), generator=g)
    return torch.cat([first, first], 1)


def token_labels(ids: torch.Tensor) -> torch.Tensor:
    """Token classification: at t >= T/2 - 1 the label is the next (copied) token, else ignored.  # [n, T]"""
    labels = torch.full_like(ids, IGNORE)
    labels[:, T // 2 - 1:-1] = ids[:, T // 2:]
    return labels


def gpt2(steps: int):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=L, n_head=H, n_embd=C, vocab_size=V, n_positions=T, bos_token_id=0,
                                  eos_token_id=0)
    cfg._attn_implementation = "eager"
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train = repeat_data(16 * steps, seed=1)
    for i in range(steps):
        ids = train[16 * i: 16 * (i + 1)]
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"GPT-2 ({L} layers, {H} heads, d_model {C}, vocabulary {V}) trained {steps} steps; last loss "
          f"{float(loss.detach()):.3f}")
    return model.eval()


def peer_sweep(bridge, batches: list, task: str) -> tuple[dict, float]:
    """The naive loop over the same batches: per batch one clean and one run_with_hooks per head;
    per head (accuracy, loss) over all scored units."""
    sums: dict = {}

    def add(key, logits, targets):
        s = score(logits, targets)
        acc, loss, n = sums.get(key, (0.0, 0.0, 0.0))
        sums[key] = (acc + float(s.correct.sum()), loss + float(s.loss_sum.sum()), n + float(s.count.sum()))

    start = time.perf_counter()
    with torch.no_grad():
        for ids, labels in batches:
            targets = targets_for(task, ids, labels)
            add("clean", logits_of(bridge(ids)), targets)
            for layer in range(L):
                for head in range(H):
                    def zero(z, hook, head=head):  # z: [B, T, H, D]
                        z[:, :, head] = 0.0
                        return z
                    add((layer, head), bridge.run_with_hooks(ids, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero)]),
                        targets)
    seconds = time.perf_counter() - start
    return {k: (a / max(n, 1), lo / max(n, 1)) for k, (a, lo, n) in sums.items()}, seconds


def ours(model, batches: list, task: str, attention: bool):
    start = time.perf_counter()
    result = ablate_heads(model, batches, task=task, progress=False, attention=attention)
    return result, time.perf_counter() - start


def cell(model, bridge, ids: torch.Tensor, kind: str, batch: int, attention: bool, ours_first: bool) -> dict:
    """One (task, batch size) cell: peer and ours over the same batches, back to back."""
    task = TASKS[kind]
    labels = token_labels(ids) if kind == "token" else None
    batches = [(ids[i:i + batch], None if labels is None else labels[i:i + batch]) for i in range(0, len(ids), batch)]
    runs: dict = {}
    order = ["ours", "peer"] if ours_first else ["peer", "ours"]
    for side in order:
        if side == "peer":
            runs["peer"] = peer_sweep(bridge, batches, task)
        else:
            runs["ours"] = ours(model, batches, task, attention=False)
            if attention:
                runs["ours_attention"] = ours(model, batches, task, attention=True)
    peer, t_peer = runs["peer"]
    exact, t_ours = runs["ours"]
    d_loss = max(abs(h.delta_loss - (peer[(h.layer, h.head)][1] - peer["clean"][1])) for h in exact.heads)
    d_acc = max(abs(h.delta_accuracy - (peer[(h.layer, h.head)][0] - peer["clean"][0])) for h in exact.heads)
    out = {"task": kind, "batch": batch, "peer": t_peer, "ours": t_ours, "ratio": t_peer / t_ours,
           "micro_batch": exact.timing["micro_batch"], "replication": exact.timing["replication"],
           "d_loss": d_loss, "d_acc": d_acc, "load": os.getloadavg()[0]}
    if attention:
        out["ours_attention"] = runs["ours_attention"][1]
        out["ratio_attention"] = t_peer / runs["ours_attention"][1]
    return out


def show(c: dict) -> None:
    att = (f"; attention on {c['ours_attention']:6.1f} s = {c['ratio_attention']:.2f}x (goal >= 1.2x)"
           if "ratio_attention" in c else "")
    print(f"  {c['task']:5s} batch {c['batch']:4d}: peer {c['peer']:6.1f} s, ours {c['ours']:6.1f} s = "
          f"{c['ratio']:.2f}x (goal >= 1.5x){att}; micro-batch {c['micro_batch']}, {c['replication']} head(s) "
          f"per forward; max |diff| dloss {c['d_loss']:.1e} dacc {c['d_acc']:.1e}; load {c['load']:.1f}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, choices=[1, 2], default=1, help="torch threads (both sides)")
    parser.add_argument("--batch-sizes", default="16,32,128", help="comma-separated; the peer uses the same batches")
    parser.add_argument("--tasks", default="lm,token", help="comma-separated: lm, token")
    parser.add_argument("--attention-at", default="", help="batch sizes (comma-separated) at which ours is also "
                        "timed with attention statistics on, the CLI default")
    parser.add_argument("--sequences", type=int, default=N, help=f"sequences of {T} tokens (default {N})")
    parser.add_argument("--train-steps", type=int, default=10, help="training steps of the GPT-2 (batch 16)")
    parser.add_argument("--demo", action="store_true", help="also --fast against exact on the demo models")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformer_lens.model_bridge import TransformerBridge

    model = gpt2(steps=args.train_steps)
    ids = repeat_data(args.sequences, seed=7)  # [N, T]
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        bridge = TransformerBridge.boot_transformers(folder, device="cpu").eval()
    with torch.no_grad():
        assert (logits_of(bridge(ids[:4])) - logits_of(model(ids[:4]))).abs().max() < 1e-4, "bridge != model"
    ours(model, [(ids[:8], None)], "lm", attention=True)  # warm-up: first-call overheads excluded on both sides
    print(f"exact sweep of {L * H} heads over {len(ids)} x {T} tokens, torch threads {torch.get_num_threads()}, "
          f"device cpu; ratio = peer time / ours")
    n = 0
    for kind in args.tasks.split(","):
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            attention = str(batch) in args.attention_at.split(",")
            show(cell(model, bridge, ids, kind, batch, attention, ours_first=n % 2 == 1))
            n += 1
    if args.demo:
        demo_models()


def demo_models() -> None:
    """Spearman between the fast ranking and exact delta loss on the demo models, and the time ratio."""
    from diagnose.demo import demo_variants, task_data
    from diagnose.zoo import Transformer, train

    print("\ndemo models (quick training): Spearman of --fast's ranking to exact ablation, and time ratio")
    for v in demo_variants(quick=True):
        data = task_data(v.task)
        tr, ev = data.split(len(data) - 512)
        torch.manual_seed(v.train.seed)
        model = Transformer(v.model)
        train(model, tr, v.train)
        t0 = time.perf_counter()
        exact = ablate_heads(model.eval(), ev.tensors(), task=data.task, progress=False, attention=False)
        t1 = time.perf_counter()
        ablate_heads(model, ev.tensors(), task=data.task, progress=False, attention=False, fast=True, top=2)
        t2 = time.perf_counter()
        c = exact.correlations["fast_vs_exact"]
        rho = "undefined" if c["rho"] is None else f"{c['rho']:+.2f} (p = {c['p_value']:.2g})"
        print(f"  {v.name:10s} Spearman {rho} over {c['n']} heads; exact {t1 - t0:.2f} s, fast (top 2) "
              f"{t2 - t1:.2f} s = {(t1 - t0) / (t2 - t1):.1f}x")


if __name__ == "__main__":
    main()
