"""Exact head-ablation sweep: diagnose.ablate_heads against the naive peer loop.

Peer: TransformerLens 4 TransformerBridge.run_with_hooks zeroing blocks.{l}.attn.hook_z[:, :, h],
one forward per head, over the same 6-layer, 8-head HF GPT-2 (d_model 256, trained for a few
seconds so that heads matter) and the same 256 sequences of length 64. Then --fast against
the exact sweep, on that model and on the demo models (Spearman of the fast ranking to exact).

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_ablation.py [--part gpt2|demo] [--variants]
(about 12 minutes on one contended core, mostly the peer loop; --variants adds our sweep without
prefix reuse and with attention statistics, about 6 minutes more).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from diagnose.ablation import ablate_heads
from diagnose.objectives import logits_of, score, targets_for

V, T, N, L, H, C = 256, 64, 256, 6, 8, 256


def repeat_data(n: int, seed: int) -> torch.Tensor:
    """Random halves repeated once: the second half is predictable by copying.  # [n, T]"""
    g = torch.Generator().manual_seed(seed)
    first = torch.randint(1, V, (n, T // 2), generator=g)
    return torch.cat([first, first], 1)


def gpt2(steps: int):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=L, n_head=H, n_embd=C, vocab_size=V, n_positions=T, bos_token_id=0,
                                  eos_token_id=0)
    cfg._attn_implementation = "eager"
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train = repeat_data(16 * steps, seed=1)
    start = time.perf_counter()
    for i in range(steps):
        ids = train[16 * i: 16 * (i + 1)]
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"trained GPT-2 ({L} layers, {H} heads, d_model {C}) for {steps} steps in "
          f"{time.perf_counter() - start:.0f} s; last loss {float(loss.detach()):.3f}")
    return model.eval()


def peer_sweep(bridge, ids: torch.Tensor) -> tuple[dict, float]:
    """The naive loop: one run_with_hooks per head over all sequences; per-head (acc, loss)."""
    targets = targets_for("lm", ids, None)

    def measure(logits):
        s = score(logits, targets)
        return float(s.accuracy), float(s.loss)

    start = time.perf_counter()
    with torch.no_grad():
        out = {"clean": measure(logits_of(bridge(ids)))}
        for layer in range(L):
            for head in range(H):
                def zero(z, hook, head=head):  # z: [B, T, H, D]
                    z[:, :, head] = 0.0
                    return z
                logits = bridge.run_with_hooks(ids, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero)])
                out[(layer, head)] = measure(logits)
    return out, time.perf_counter() - start


def ours(model, ids, **kw):
    start = time.perf_counter()
    result = ablate_heads(model, [(ids[i:i + 32], None) for i in range(0, len(ids), 32)], task="lm", progress=False,
                          **{"attention": False, **kw})
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=["all", "gpt2", "demo"], default="all")
    parser.add_argument("--train-steps", type=int, default=10, help="training steps of the GPT-2 (batch 16)")
    parser.add_argument("--variants", action="store_true", help="also time ours without reuse / with attention")
    parser.add_argument("--skip-peer", action="store_true", help="time only ours (exact vs --fast)")
    args = parser.parse_args()
    if args.part in ("all", "gpt2"):
        gpt2_sweeps(args.train_steps, args.variants, args.skip_peer)
    if args.part in ("all", "demo"):
        demo_models()


def gpt2_sweeps(train_steps: int, variants: bool, skip_peer: bool = False) -> None:
    from transformer_lens.model_bridge import TransformerBridge

    model = gpt2(steps=train_steps)
    ids = repeat_data(N, seed=7)  # [N, T]
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        bridge = TransformerBridge.boot_transformers(folder, device="cpu").eval()
    with torch.no_grad():
        assert (logits_of(bridge(ids[:4])) - logits_of(model(ids[:4]))).abs().max() < 1e-4, "bridge != model"

    peer, t_peer = ({"clean": (0.0, 0.0), **{(l, h): (0.0, 0.0) for l in range(L) for h in range(H)}}, float("nan")) \
        if skip_peer else peer_sweep(bridge, ids)
    ours(model, ids[:32])  # warm-up (first-call overheads on both sides are excluded)
    exact, t_exact = ours(model, ids)
    t_noreuse = ours(model, ids, reuse=False)[1] if variants else float("nan")
    t_full = ours(model, ids, attention=True)[1] if variants else float("nan")
    fast, t_fast = ours(model, ids, fast=True, top=5)
    _, t_rank = ours(model, ids, fast=True, top=0)

    d_loss = max(abs(h.delta_loss - (peer[(h.layer, h.head)][1] - peer["clean"][1])) for h in exact.heads)
    d_acc = max(abs(h.delta_accuracy - (peer[(h.layer, h.head)][0] - peer["clean"][0])) for h in exact.heads)
    print(f"\nexact sweep of {L * H} heads, {N} x {T} tokens (torch threads: {torch.get_num_threads()})")
    print(f"  peer  TransformerLens run_with_hooks loop   {t_peer:7.2f} s  ({L * H + 1} forwards)")
    print(f"  ours  ablate_heads (grad importance, KL, CIs) {t_exact:5.2f} s  ({exact.timing['forward_passes']} "
          f"forwards, {exact.timing['examples_forwarded']} sequence-forwards)")
    print(f"  ours  without prefix reuse                  {t_noreuse:7.2f} s")
    print(f"  ours  with attention statistics too         {t_full:7.2f} s")
    print(f"  speed-up vs peer: {t_peer / t_exact:.2f}x (goal >= 1.5x); prefix reuse alone: {t_noreuse / t_exact:.2f}x")
    print(f"  max |diff| to peer: delta loss {d_loss:.2e}, delta accuracy {d_acc:.2e} (goal <= 1e-5)")
    rho = exact.correlations["fast_vs_exact"]["rho"]
    print(f"\n--fast on the GPT-2: top 5 verified {t_fast:.2f} s ({t_exact / t_fast:.1f}x faster than exact); "
          f"ranking only (--top 0) {t_rank:.2f} s ({t_exact / t_rank:.1f}x); Spearman(grad importance, exact "
          f"delta loss) over all heads {rho:+.2f}")
    top5 = {(h.layer, h.head) for h in sorted(exact.heads, key=lambda h: -h.delta_loss)[:5]}
    found = len(top5 & {(h.layer, h.head) for h in fast.heads if h.verified})
    print(f"  top-5 heads by exact delta loss found by --fast: {found}/5", flush=True)


def demo_models() -> None:
    """Spearman between the fast ranking (gradient importance) and exact delta loss on the demo models."""
    from diagnose.demo import demo_variants
    from diagnose.demo import task_data
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
