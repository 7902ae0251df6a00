"""A synthetic `diagnose.heads/1` document of any size, built through the engine's own objects.

Each head is a `HeadEffect`; roles, correlations and flags come from `diagnose.ablation.roles` and
`contrast` (the same calls the engine makes after a sweep), significance from Holm's correction,
and the file is written by `HeadsResult.save`, so it has the fields, nesting and indentation of a
real `diagnose heads --json` file. Kept examples are causal maps over `seq_len` tokens in the
engine's format (per layer [H, T, T], rounded to 4 decimals). Only the numbers are made up: a few
planted vital heads, a band of first-token heads that matter little, and noise elsewhere.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from diagnose.statistics import ATTENTION_STATS
from diagnose.ablation import contrast, roles, significance
from diagnose.ablation.result import HeadEffect, HeadsResult


def _attention(rng: np.random.Generator, sink: bool, prev: bool) -> dict[str, float]:
    """Plausible statistics of one head: shares that sum to at most 1, entropy that falls as they peak."""
    first = rng.uniform(0.85, 0.97) if sink else rng.uniform(0.02, 0.3)
    prev_tok = rng.uniform(0.6, 0.9) if prev else rng.uniform(0.0, (1 - first) * 0.4)
    prev_tok = min(prev_tok, 1 - first)
    rest = 1 - first - prev_tok
    self_, nxt = rest * rng.uniform(0, 0.3), 0.0
    local = prev_tok + nxt + rest * rng.uniform(0, 0.2)
    peak = max(first, prev_tok, self_)
    return {"entropy": float(-np.log(max(peak, 1e-3)) + rng.uniform(0.2, 1.5) * (1 - peak)),
            "max_weight": float(peak), "first_token": float(first), "self": float(self_),
            "prev_token": float(prev_tok), "padding": 0.0, "mean_distance": float(rng.uniform(0.5, 12)),
            "next_token": nxt, "last_token": float(rest * rng.uniform(0, 0.1)), "local": float(local),
            "duplicate_token": float(rest * 0.05), "induction": float(rest * 0.05)}  # a little, as in most heads


def _head(rng: np.random.Generator, layer: int, head: int, n_layers: int, n_examples: int) -> HeadEffect:
    vital = rng.random() < 0.01
    sink = not vital and rng.random() < 0.02 + 0.04 * (layer / n_layers)
    prev = not sink and rng.random() < 0.04
    d_loss = float(rng.uniform(0.05, 0.6) if vital else abs(rng.normal(0, 0.003)) * (1 + 3 * prev))
    d_acc = float(-rng.uniform(0.03, 0.2) if vital else rng.normal(0, 0.002))
    ci_acc = [d_acc - 1.96 / np.sqrt(n_examples) * 0.1, d_acc + 1.96 / np.sqrt(n_examples) * 0.1]
    grad_raw = float(abs(rng.normal(0, 0.01)) + (0.2 if vital else 0.0))
    return HeadEffect(
        layer=layer, head=head, accuracy=0.71 + d_acc, delta_accuracy=d_acc, delta_accuracy_ci=ci_acc,
        p_value=float(rng.uniform(1e-9, 1e-5) if vital else rng.uniform(0.05, 1)), p_value_adjusted=None,
        significant=None, loss=1.9 + d_loss, delta_loss=d_loss, kl=d_loss * 0.9 + 1e-4,
        grad_importance=0.0, grad_importance_raw=grad_raw, estimated_delta_loss=d_loss * rng.uniform(0.5, 1.5),
        verified=True, attention=_attention(rng, sink, prev),
        delta_loss_ci=[d_loss - 0.002, d_loss + 0.002],
        p_value_loss=float(rng.uniform(1e-6, 1e-4) if vital else rng.uniform(0.02, 1)),
        second_order_delta_loss=d_loss * rng.uniform(0.7, 1.3))


def _examples(rng: np.random.Generator, n_layers: int, n_heads: int, seq_len: int, n_kept: int) -> list:
    """[{index, tokens, attention: per layer [H, T, T]}], causal and rounded as the engine writes them."""
    causal = np.tril(np.ones((seq_len, seq_len), dtype=bool))
    out = []
    for i in range(n_kept):
        layers = []
        for _ in range(n_layers):
            s = np.where(causal, rng.normal(0, 2, size=(n_heads, seq_len, seq_len)).astype(np.float32), -np.inf)
            s[:, :, 0] += rng.uniform(0, 6, size=(n_heads, 1)).astype(np.float32)  # some heads sink on token 0
            p = np.exp(s - s.max(-1, keepdims=True))
            layers.append(np.round(p / p.sum(-1, keepdims=True), 4).tolist())  # [H, T, T]
        out.append({"index": i, "tokens": [f"tok{j}" for j in range(seq_len)], "attention": layers})
    return out


def make_result(n_layers: int, n_heads: int, *, seq_len: int = 32, n_kept: int = 3, n_examples: int = 512,
                seed: int = 0) -> tuple[HeadsResult, dict[str, float]]:
    """The result and the seconds the engine's own report-side computations took (roles, correlations,
    flags), which scale with the number of heads too."""
    rng = np.random.default_rng(seed)
    heads = [_head(rng, layer, head, n_layers, n_examples) for layer in range(n_layers) for head in range(n_heads)]
    for layer in range(n_layers):  # Michel et al.: l2-normalised within the layer
        hs = heads[layer * n_heads:(layer + 1) * n_heads]
        norm = float(np.sqrt(sum(h.grad_importance_raw ** 2 for h in hs))) or 1.0
        for h in hs:
            h.grad_importance = h.grad_importance_raw / norm
    adjusted = significance.adjust(np.array([h.p_value_loss for h in heads]), "holm")
    for h, p in zip(heads, adjusted):
        h.p_value_loss_adjusted = float(p)
        h.significant = bool(p < 0.05)
    p_acc = significance.adjust(np.array([h.p_value for h in heads]), "holm")
    for h, p in zip(heads, p_acc):
        h.p_value_adjusted = float(p)
    baseline = {"accuracy": 0.71, "loss": 1.9}
    band = contrast.default_band(baseline["loss"])
    for h in heads:
        h.negligible = contrast.negligible(h, band)
    times = {}
    t = time.perf_counter()
    roles.assign(heads)
    times["roles_s"] = time.perf_counter() - t
    t = time.perf_counter()
    correlations = contrast.correlations(heads)
    times["correlations_s"] = time.perf_counter() - t
    t = time.perf_counter()
    flags = contrast.flags(heads, baseline["loss"], band)
    times["flags_s"] = time.perf_counter() - t
    result = HeadsResult(
        model={"family": "synthetic", "n_layers": n_layers, "n_heads": n_heads, "class": "Synthetic"},
        task="lm", method="zero", n_examples=n_examples, n_units=n_examples * 127, baseline=baseline,
        heads=heads, correlations=correlations, flags=flags,
        timing={"seconds": 3600.0, "forward_passes": n_layers * n_heads + 1},
        significance={"correction": "holm", "alpha": 0.05, "n_tested": len(heads),
                      "n_significant": sum(bool(h.significant) for h in heads), "drives": "delta_loss"},
        examples=_examples(rng, n_layers, n_heads, seq_len, n_kept))
    return result, times


def write_heads(path: Path, n_layers: int, n_heads: int, **kwargs: Any) -> tuple[Path, dict[str, float]]:
    result, times = make_result(n_layers, n_heads, **kwargs)
    return result.save(path), times


assert set(ATTENTION_STATS) <= set(_attention(np.random.default_rng(0), False, False)), "a statistic is missing"
