"""Builders of schema-valid report inputs (DESIGN.md: `diagnose.heads/1` JSON and
`diagnose.run/1` folders), written independently of the code that produces them in real use,
so the report is tested against the contract rather than against one producer."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

XSS = "<img src=x onerror=alert(1)>"
# token text that would run script or break the page if any of it reached the HTML unescaped
HOSTILE_TOKENS = ["<s>", XSS, "</script><script>alert(2)</script>", "a & b", "\u2028x", "c", "d", "e"]


def causal_maps(rng: np.random.Generator, n_layers: int, n_heads: int, t: int,
                first_token_heads: Sequence[tuple[int, int]] = ()) -> np.ndarray:
    """Random causal attention [L, H, T, T], rows summing to 1; listed heads look at token 0."""
    scores = rng.normal(0, 2, size=(n_layers, n_heads, t, t))  # [L, H, Tq, Tk]
    scores = np.where(np.tril(np.ones((t, t), dtype=bool)), scores, -np.inf)
    for layer, head in first_token_heads:
        scores[layer, head, :, 0] += 12.0
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def make_heads(n_layers: int = 2, n_heads: int = 4, *, seq_len: int = 8, n_kept: int = 2, seed: int = 0,
               family: str = "reference", vital: Sequence[tuple[int, int]] = ((1, 2),),
               inert: Sequence[tuple[int, int]] = ((0, 1),), tokens: list[str] | None = None) -> dict[str, Any]:
    """A `diagnose.heads/1` document with planted vital heads and striking-but-inert heads."""
    rng = np.random.default_rng(seed)
    heads = []
    for layer in range(n_layers):
        for head in range(n_heads):
            is_vital, is_inert = (layer, head) in vital, (layer, head) in inert
            d_acc = -0.3 - 0.05 * rng.random() if is_vital else float(rng.normal(0, 0.004))
            d_loss = 1.5 + rng.random() if is_vital else abs(float(rng.normal(0, 0.01)))
            max_w = 0.95 if is_inert else float(rng.uniform(0.2, 0.6))
            heads.append({
                "layer": layer, "head": head, "accuracy": 0.97 + d_acc, "delta_accuracy": d_acc,
                "delta_accuracy_ci": [d_acc - 0.02, d_acc + 0.02],
                "p_value": 1e-9 if is_vital else float(rng.uniform(0.2, 1.0)),
                "loss": 0.1 + d_loss, "delta_loss": d_loss, "kl": d_loss * 0.8,
                "grad_importance": (0.8 if is_vital else float(rng.uniform(0, 0.3))),
                "significant": is_vital,
                "attention": {"entropy": 0.15 if is_inert else float(rng.uniform(0.8, 2.0)),
                              "max_weight": max_w, "first_token": 0.9 if is_inert else float(rng.uniform(0, 0.3)),
                              "self": float(rng.uniform(0, 0.3)), "prev_token": float(rng.uniform(0, 0.3)),
                              "padding": 0.0, "mean_distance": float(rng.uniform(0, 4))},
            })
    flags = [{"layer": l, "head": h, "kind": "striking_but_inert",
              "reason": f"90% of its weight is on the first token, yet removing it changes accuracy by "
                        f"{heads[l * n_heads + h]['delta_accuracy']:+.3f} (p = 0.6)"} for l, h in inert]
    examples = []
    for i in range(n_kept):
        toks = list(tokens) if tokens and i == 0 else [f"t{i}_{j}" for j in range(seq_len)]
        att = causal_maps(rng, n_layers, n_heads, len(toks), inert)
        examples.append({"tokens": toks, "attention": np.round(att, 5).tolist()})
    return {
        "schema": "diagnose.heads/1",
        "model": {"family": family, "n_layers": n_layers, "n_heads": n_heads},
        "task": "classification", "method": "zero", "n_examples": 512,
        "baseline": {"accuracy": 0.97, "loss": 0.1},
        "heads": heads,
        "correlations": _correlations(heads),
        "flags": flags,
        "timing": {"seconds": 1.25, "forward_passes": n_layers * n_heads + 1},
        "examples": examples,
    }


def _correlations(heads: list[dict[str, Any]]) -> dict[str, Any]:
    """As the engine writes them: Spearman of each statistic against delta loss; first_token planted,
    so that a test can tell the document's figure from a recomputed one."""
    from scipy.stats import spearmanr

    y = [h["delta_loss"] for h in heads]
    out: dict[str, Any] = {"effect": "delta_loss"}
    for stat in ("entropy", "max_weight", "self", "prev_token", "mean_distance"):
        r = spearmanr([h["attention"][stat] for h in heads], y)
        out[stat] = {"rho": float(r.statistic), "p_value": float(r.pvalue), "n": len(heads)}
    r = spearmanr([h["grad_importance"] for h in heads], y)
    out["grad_importance"] = {"rho": float(r.statistic), "p_value": float(r.pvalue), "n": len(heads)}
    out["first_token"] = {"rho": -0.123, "p_value": 0.456, "n": len(heads)}
    return out


def write_heads(path: Path, **kwargs) -> Path:
    path.write_text(json.dumps(make_heads(**kwargs)))
    return path


def write_run(run_dir: Path, *, steps: int = 200, n_layers: int = 2, n_heads: int = 4,
              attention_every: int = 10, alerts: Sequence[dict[str, Any]] = (), nan_from: int | None = None,
              torn: bool = False, seed: int = 0, clip: float | None = None, throughput: bool = False,
              evals_every: int | None = None, spike_steps: Sequence[int] = (), loss_scale: float = 1.0) -> Path:
    """A `diagnose.run/1` folder: a smoothly decaying loss, warmup, per-layer stats, alerts.

    clip: run.json `clip` and a clip_coef per step; throughput: step_time / tokens / tokens_per_s;
    evals_every: evals.jsonl with loss and accuracy; spike_steps: spikes/step_N.json records."""
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    blocks = [f"blocks.{i}" for i in range(n_layers)]
    info = {"schema": "diagnose.run/1", "model": {"family": "reference", "blocks": blocks, "n_params": 12345},
            "settings": {"every": 1, "attention_every": attention_every}, "started": "2026-11-29T09:00:00+00:00",
            "sessions": [{"started": "2026-11-29T09:00:00+00:00", "pid": 1}], "closed": not torn}
    if clip is not None:
        info["clip"] = clip
    (run_dir / "run.json").write_text(json.dumps(info))
    lines = []
    for s in range(steps):
        bad = nan_from is not None and s >= nan_from
        rec = {"step": s, "time": 0.01 * s,
               "loss": math.nan if bad else loss_scale * (3.0 * math.exp(-3 * s / steps) + 0.05 * rng.random()),
               "lr": 1e-3 * min(1.0, (s + 1) / 20), "grad_norm": math.nan if bad else 1.0 + 0.2 * rng.random(),
               "layers": {b: {"grad_norm": 0.5 / (i + 1) + 0.05 * rng.random(), "act_mean": 0.0,
                              "act_var": (1.0 + 0.1 * i) * (1 + s / steps), "act_max_abs": 4.0,
                              "token_cos": min(1.0, 0.2 + 0.1 * i)} for i, b in enumerate(blocks)}}
        if clip is not None and not bad:
            rec["clip_coef"] = min(1.0, clip / rec["grad_norm"])
        if throughput:
            rec.update(step_time=0.1, tokens=4096, tokens_per_s=40960.0 if s < steps // 2 else 20480.0)
        if s % attention_every == 0:
            rec["attention"] = {f"{b}.attn": {"entropy": [2.0 - 1.5 * s / steps * (h == 0) for h in range(n_heads)],
                                              "max_weight": [0.3] * n_heads, "uniform_entropy": math.log(16)}
                                for b in blocks}
        lines.append(json.dumps(rec))
    text = "\n".join(lines) + "\n"
    if torn:
        text += '{"step": 99999, "loss": 1.'
    (run_dir / "metrics.jsonl").write_text(text)
    (run_dir / "alerts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in alerts))
    if evals_every:
        (run_dir / "evals.jsonl").write_text("".join(
            json.dumps({"step": s, "time": 0.01 * s, "loss": 2.5 * math.exp(-2 * s / steps) + 0.1,
                        "metrics": {"accuracy": min(1.0, 0.1 + s / steps)}}) + "\n"
            for s in range(0, steps, evals_every)))
    for s in spike_steps:
        (run_dir / "spikes").mkdir(exist_ok=True)
        (run_dir / "spikes" / f"step_{s:08d}.json").write_text(json.dumps(
            {"step": s, "kinds": ["grad_spike"], "tensors": {"input_ids": {"shape": [8, 16], "dtype": "int64"},
                                                             "labels": {"shape": [8, 16], "dtype": "int64"},
                                                             "per_example_loss": {"shape": [8], "dtype": "float32"}},
             "bytes": 2080, "truncated": False, "note": f"{XSS} batch of 8"}))
    return run_dir


def alert(step: int, kind: str = "grad_spike", severity: str = "warning", where: str = "blocks.1",
          message: str = "gradient norm 12x its recent median", hint: str = "add linear warmup") -> dict[str, Any]:
    return {"step": step, "kind": kind, "severity": severity, "where": where, "message": message, "hint": hint}


def make_checks(findings: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A `diagnose.checks/1` document."""
    if findings is None:
        findings = [{"check": "causal_leak", "severity": "error", "title": "Future tokens leak into the past",
                     "evidence": {"max_change_at_earlier_positions": 0.42, "positions": "0..7"},
                     "fix": "apply the causal mask before the softmax"}]
    return {"schema": "diagnose.checks/1", "findings": list(findings)}


def make_lessons() -> dict[str, Any]:
    """A `diagnose.lessons/1` document (the demo's measured design lessons)."""
    return {"schema": "diagnose.lessons/1", "lessons": [
        {"key": "warmup", "title": "Warmup", "claim": "Without warmup, <b>gradient spikes</b> early.",
         "a": "warmup", "b": "no-warmup", "runs": ["runs/warmup", "runs/no-warmup"],
         "rows": [{"metric": "max grad norm", "a": 1.23456, "b": 45.6789, "fmt": ".3g"},
                  {"metric": "alerts", "a": "none", "b": "grad_spike x3", "fmt": "s"},
                  {"metric": "accuracy", "a": None, "b": 0.5, "fmt": ".3f"}]}]}
