"""Forward time of a model folder against its `diagnose prune` output, interleaved in one run.

    python bench/bench_prune.py ORIGINAL_FOLDER PRUNED_FOLDER DATA.jsonl [--threads 1] [--repeats 30] [--batch 64]

Both are loaded with transformers (the pruned one through its pruned_heads.py), the same batch is
run through each in turn (so machine load hits both), and the medians and their ratio are printed
with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import transformers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("original")
    ap.add_argument("pruned")
    ap.add_argument("data")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    auto = transformers.AutoModelForSequenceClassification
    models = {"original": auto.from_pretrained(args.original).eval(),
              "pruned": auto.from_pretrained(args.pruned, trust_remote_code=True).eval()}
    tok = transformers.AutoTokenizer.from_pretrained(args.original)
    with open(args.data, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()][:args.batch]
    batch = tok(texts, padding=True, return_tensors="pt")
    times: dict[str, list[float]] = {k: [] for k in models}
    with torch.no_grad():
        for m in models.values():
            m(**batch)  # warm-up
        for _ in range(args.repeats):
            for name, m in models.items():
                start = time.perf_counter()
                m(**batch)
                times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    params = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
    print(f"batch {tuple(batch['input_ids'].shape)}, {args.threads} thread(s), {args.repeats} interleaved repeats, "
          f"load average {os.getloadavg()[0]:.1f}")
    for k in models:
        print(f"{k:9s} {params[k]:>11,} parameters, median forward {med[k] * 1e3:8.1f} ms")
    print(f"speedup {med['original'] / med['pruned']:.2f}x")


if __name__ == "__main__":
    main()
