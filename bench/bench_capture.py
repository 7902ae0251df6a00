"""Peak memory and time of statistics-only attention capture vs a plain forward vs
TransformerLens run_with_cache, side by side.

Model: Hugging Face GPT-2, 6 layers, 8 heads, d_model 256, random init, eager attention
(vocabulary 1024, so the logits do not drown the attention maps). Data: 256 random
sequences of length 512 in batches of 32. Each side runs in its own subprocess so that
peaks (bench/_peak.py) do not mix; the time ratio comes from one more process that runs the plain
forward and the statistics on each batch in turn, so that load from other processes on a
shared machine hits both sides alike.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_capture.py [--n 256] [--seq 512] [--batch 32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _peak import peak_bytes

MODES = ("plain", "stats", "stats-whole", "tl", "time")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _batches(n: int, seq: int, batch: int, vocab: int):
    import torch

    g = torch.Generator().manual_seed(0)
    for _ in range(0, n, batch):
        yield torch.randint(0, vocab, (batch, seq), generator=g)  # [B, T]


def worker(mode: str, folder: str, n: int, seq: int, batch: int) -> dict:
    import torch

    torch.set_num_threads(1)
    if mode == "tl":
        from transformer_lens.model_bridge import TransformerBridge

        model = TransformerBridge.boot_transformers(folder, device="cpu")
    else:
        from transformers import GPT2LMHeadModel

        model = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager")
    model.eval()
    vocab = 1024
    import diagnose

    loaded = _rss_mb()
    start = time.perf_counter()
    summary = None
    with torch.no_grad():
        if mode == "plain":
            for ids in _batches(n, seq, batch, vocab):
                model(ids)
        elif mode.startswith("stats"):
            # "stats": the default micro-batching (maps of at most 2**24 elements per forward);
            # "stats-whole": each batch of 32 in one forward, like the plain side
            data = ((ids, None) for ids in _batches(n, seq, batch, vocab))
            summary = diagnose.attention_summary(model, data, keep=0, micro_batch=0 if mode == "stats-whole" else None)
        elif mode == "tl":
            for ids in _batches(n, seq, batch, vocab):
                _, cache = model.run_with_cache(ids)
                del cache
        else:  # "time": plain and stats on each batch in turn, so load from other processes hits both alike
            sites = diagnose.find_heads(model)
            spent = {"plain": 0.0, "stats": 0.0}
            for i, ids in enumerate(_batches(n, seq, batch, vocab)):
                for side in (("plain", "stats") if i % 2 == 0 else ("stats", "plain")):
                    t0 = time.perf_counter()
                    if side == "plain":
                        model(ids)
                    else:
                        diagnose.attention_summary(model, [(ids, None)], keep=0, sites=sites)
                    spent[side] += time.perf_counter() - t0
            return {"mode": mode, **{f"{k}_seconds": v for k, v in spent.items()}}
    seconds = time.perf_counter() - start
    peak = peak_bytes() / 2**20  # MiB
    out = {"mode": mode, "seconds": seconds, "peak_mb": peak, "loaded_mb": loaded}
    if summary is not None:
        out["entropy_layer0_head0"] = summary.stats[0]["entropy"][0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--worker", choices=MODES)
    ap.add_argument("--folder")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.folder, args.n, args.seq, args.batch)))
        return

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=6, n_head=8, n_embd=256, n_positions=args.seq, vocab_size=1024,
                     bos_token_id=0, eos_token_id=0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(Path(tmp) / "gpt2")
        GPT2LMHeadModel(cfg).save_pretrained(folder)
        rows = {}
        for mode in MODES:
            cmd = [sys.executable, __file__, "--worker", mode, "--folder", folder,
                   "--n", str(args.n), "--seq", str(args.seq), "--batch", str(args.batch)]
            res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if res.returncode:
                sys.exit(f"{mode} failed:\n{res.stderr[-3000:]}")
            rows[mode] = json.loads(res.stdout.strip().splitlines()[-1])
            if mode == "time":
                break
            print(f"{mode:11s} peak RSS {rows[mode]['peak_mb']:8.0f} MB  (after load {rows[mode]['loaded_mb']:6.0f} MB)"
                  f"  time {rows[mode]['seconds']:7.1f} s", flush=True)
    p, s, w, t = rows["plain"], rows["stats"], rows["stats-whole"], rows["tl"]
    grow = {k: r["peak_mb"] - r["loaded_mb"] for k, r in rows.items() if k != "time"}
    assert abs(s["entropy_layer0_head0"] - w["entropy_layer0_head0"]) < 1e-4, "micro-batching changed the statistics"
    print(f"\n{args.n} sequences x {args.seq} tokens, batches of {args.batch}, GPT-2 6x8 heads, d_model 256, eager")
    print(f"peak RSS  stats / TransformerLens = {s['peak_mb'] / t['peak_mb']:.3f}   (goal <= 0.25)")
    print(f"peak RSS  stats / plain forward   = {s['peak_mb'] / p['peak_mb']:.3f}   (goal <= 1.3)")
    print(f"growth over loaded model: stats {grow['stats']:.0f} MB, stats-whole {grow['stats-whole']:.0f} MB, "
          f"plain {grow['plain']:.0f} MB, "
          f"TransformerLens {grow['tl']:.0f} MB")
    print(f"peak RSS  stats-whole / TL    = {w['peak_mb'] / t['peak_mb']:.3f},  / plain = {w['peak_mb'] / p['peak_mb']:.3f}"
          "   (no micro-batching)")
    tm = rows["time"]
    print(f"time      stats / plain forward   = {tm['stats_seconds'] / tm['plain_seconds']:.3f}   (goal <= 1.5; "
          f"interleaved batch by batch in one process: {tm['stats_seconds']:.1f} s vs {tm['plain_seconds']:.1f} s)")
    print(f"time      separate processes: stats / plain = {s['seconds'] / p['seconds']:.3f}, "
          f"stats-whole / plain = {w['seconds'] / p['seconds']:.3f}")
    print(f"time      TransformerLens / plain = {t['seconds'] / p['seconds']:.3f}")


if __name__ == "__main__":
    main()
