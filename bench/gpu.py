"""The GPU figures in one run (`make gpu`, under 10 minutes on one CUDA device): the exact sweep
against the peer loop, the monitor's step-time overhead, and long-context memory.

1. Sweep: bench_ablation's 6 x 8 GPT-2 (d_model 256, vocabulary 512, eager attention), 512
   sequences of 64 tokens, lm task, batch 32: diagnose.ablate_heads (attention off) against
   TransformerLens 4's run_with_hooks zeroing hook_z once per head over the same batches; both
   on the GPU, synchronised before each clock read; ratio = peer / ours, and the largest |diff|.
2. Monitor: the same GPT-2 trained (AdamW, batch 32) with and without
   TrainingMonitor(every=1, attention_every=10), repetitions interleaved; median step-time ratio.
3. Long context: diagnose.attention_summary on one sequence of T tokens (a 2-layer, 4-head GPT-2
   with SDPA attention) against TransformerLens run_with_cache, peak CUDA memory of each
   (torch.cuda.max_memory_allocated); the peer is skipped where its cache alone would exceed
   half the device.

On a machine without CUDA it prints "no CUDA: skipped" and exits 0. `--device cpu --small` runs
the same code at toy sizes (a smoke test of this script, not a figure).

    .venv/bin/python bench/gpu.py [--device cuda] [--small]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import bench_ablation as ab  # noqa: E402

from diagnose.ablation import ablate_heads  # noqa: E402
from diagnose.monitor import TrainingMonitor  # noqa: E402


def clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def sweep(model, bridge, device: torch.device, n: int, batch: int) -> None:
    ids = ab.repeat_data(n, seed=2).to(device)
    batches = [(ids[i:i + batch], None) for i in range(0, n, batch)]
    ablate_heads(model, batches[:1], task="lm", progress=False, attention=False)  # warm-up (kernels, plan)
    t0 = clock(device)
    result = ablate_heads(model, batches, task="lm", progress=False, attention=False)
    t1 = clock(device)
    peer, _ = ab.peer_sweep(bridge, batches, "lm")
    t2 = clock(device)
    d_loss = max(abs(h.delta_loss - (peer[(h.layer, h.head)][1] - peer["clean"][1])) for h in result.heads)
    print(f"1. sweep, {n} x {ab.T} tokens, batch {batch}: peer {t2 - t1:.2f} s, diagnose {t1 - t0:.2f} s = "
          f"{(t2 - t1) / (t1 - t0):.2f}x; micro-batch {result.timing['micro_batch']}, "
          f"{result.timing['replication']} head(s) per forward; max |diff| of delta loss {d_loss:.1e}", flush=True)


def monitor(model, device: torch.device, steps: int, reps: int) -> None:
    ids = ab.repeat_data(32 * steps, seed=3).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def loop(mon) -> float:
        t0 = clock(device)
        for i in range(steps):
            x = ids[32 * i: 32 * (i + 1)]
            loss = model(input_ids=x, labels=x).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if mon is not None:
                mon.step(loss, optimizer=opt)
            opt.step()
        return clock(device) - t0

    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        loop(None)  # warm-up
        for r in range(reps):
            plain = loop(None)
            with TrainingMonitor(model, os.path.join(tmp, f"run{r}"), every=1, attention_every=10, echo=False) as mon:
                watched = loop(mon)
            ratios.append(watched / plain)
    model.eval()
    print(f"2. monitor, every=1, attention_every=10, {steps} steps x {reps} repetitions: median step time "
          f"{statistics.median(ratios):.3f}x the plain loop (+{(statistics.median(ratios) - 1) * 100:.1f} %)",
          flush=True)


def long_context(device: torch.device, lengths: list[int]) -> None:
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    import diagnose

    with tempfile.TemporaryDirectory() as folder:
        cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=256, n_positions=max(lengths))
        transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)
        ours = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="sdpa").to(device).eval()
        bridge = TransformerBridge.boot_transformers(folder, device=str(device))
        bridge.eval()
        budget = torch.cuda.get_device_properties(device).total_memory / 2 if device.type == "cuda" else 4 * 2**30
        for T in lengths:
            ids = torch.randint(0, 256, (1, T), device=device)  # [1, T]
            cells = []
            for side in ("diagnose", "peer"):
                if side == "peer" and 2 * 2 * 4 * T * T * 4 > budget:  # scores + pattern, 2 layers x 4 heads
                    cells.append("peer skipped (cache over half the device)")
                    continue
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                t0 = clock(device)
                with torch.no_grad():
                    if side == "diagnose":
                        diagnose.attention_summary(ours, [ids], keep=1)
                    else:
                        _, cache = bridge.run_with_cache(ids)
                        del cache
                t1 = clock(device)
                peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")
                cells.append(f"{side} {peak:,.0f} MiB, {t1 - t0:.2f} s")
            print(f"3. long context, T = {T:6d}: " + "; ".join(cells), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda (default) or cpu")
    ap.add_argument("--small", action="store_true", help="toy sizes: a smoke test of the script")
    args = ap.parse_args()
    if args.device is None and not torch.cuda.is_available():
        print("no CUDA: skipped")
        return 0
    device = torch.device(args.device or "cuda")
    start = time.perf_counter()
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; torch "
          f"{torch.__version__}", flush=True)
    model = ab.gpt2(2 if args.small else 10).to(device)
    from transformer_lens.model_bridge import TransformerBridge

    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        bridge = TransformerBridge.boot_transformers(folder, device=str(device))
        bridge.eval()
        sweep(model, bridge, device, n=32 if args.small else 512, batch=16 if args.small else 32)
        del bridge
    monitor(model, device, steps=4 if args.small else 20, reps=2 if args.small else 5)
    long_context(device, [256, 512] if args.small else [4096, 16384, 32768])
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
