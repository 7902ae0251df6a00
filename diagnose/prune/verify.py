"""Checking the pruned model: its outputs against the gated original's, accuracy and loss on
held-out data, parameter count and forward time (same batch, same threads, interleaved)."""

from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn

from .._tolerance import output_scale, tolerance
from ..objectives import call_model, logits_of, score, targets_for
from ..ablation.gate import Gate
from ._measure import Measure


def compare(measure: Measure, gates: Sequence[Gate], closed: Sequence[tuple[int, int]], pruned: nn.Module,
            depth: int = 1, width: int = 1) -> dict[str, Any]:
    """The largest |pruned - gated original| over every output on the data, judged by the tolerance
    policy (diagnose/_tolerance.py) for the model's depth (attention layers) and width (d_model):
    the pruned matmuls are narrower, so they sum in another order and round differently. The gated
    original is the sweep's clean pass with `closed` shut (silent gates caught there too)."""
    worst, scale = 0.0, 1.0
    with torch.no_grad():
        for clean in measure.clean(measure.sweep(gates, closed)):
            gated = clean.logits.float()
            cut = logits_of(call_model(pruned, clean.inputs)).float()
            worst = max(worst, float((cut - gated).abs().max()) if cut.numel() else 0.0)
            scale = max(scale, output_scale(gated))
    tol = tolerance(scale, depth=depth, width=width)
    return {"max_abs_diff": worst, "output_scale": scale, "tolerance": tol, "passed": worst <= tol}


def accuracy_and_loss(model: nn.Module, batches: Sequence[tuple[Any, Any]], task: str) -> dict[str, Any]:
    """Accuracy and mean loss per scored unit of a model on held-out data, plain forwards (no gates);
    `per_example` accuracy [N] for pairing."""
    loss = correct = units = 0.0
    per = []
    with torch.no_grad():
        for inputs, labels in batches:
            sc = score(logits_of(call_model(model, inputs)), targets_for(task, inputs, labels))
            loss, correct, units = loss + float(sc.loss_sum.sum()), correct + float(sc.correct.sum()), \
                units + float(sc.count.sum())
            per.append((sc.correct / sc.count.clamp_min(1)).double().cpu().numpy())
    n = max(units, 1.0)
    return {"accuracy": correct / n, "loss": loss / n, "per_example": np.concatenate(per)}


def paired_noise(before: np.ndarray, after: np.ndarray) -> dict[str, float]:
    """The accuracy change and its 95 % interval (normal approximation of the paired per-example
    differences): how far the measured change may sit from the true one by sampling alone."""
    d = after - before
    n = max(len(d), 1)
    se = float(d.std(ddof=1) / np.sqrt(n)) if len(d) > 1 else 0.0
    mean = float(d.mean()) if len(d) else 0.0
    # at least one example's worth: an interval of width 0 (no example changed) still hides that much
    half = max(1.96 * se, 1.0 / n)
    return {"delta_accuracy": mean, "delta_accuracy_ci95": [mean - half, mean + half], "noise": half}


def n_parameters(model: nn.Module) -> int:
    return int(sum(p.numel() for p in model.parameters()))


def forward_time(original: nn.Module, pruned: nn.Module, inputs: Any, repeats: int = 7) -> dict[str, Any]:
    """Median seconds of one forward of the same batch, the two models alternating (load hits both)."""
    times: dict[str, list[float]] = {"before": [], "after": []}
    with torch.no_grad():
        for model in (original, pruned):
            call_model(model, inputs)  # warm-up
        for _ in range(max(1, repeats)):
            for key, model in (("before", original), ("after", pruned)):
                start = time.perf_counter()
                call_model(model, inputs)
                times[key].append(time.perf_counter() - start)
    before, after = statistics.median(times["before"]), statistics.median(times["after"])
    return {"forward_seconds_before": before, "forward_seconds_after": after,
            "speedup": before / after if after > 0 else None, "repeats": repeats,
            "threads": torch.get_num_threads(), "batch": _batch(inputs)}


def _batch(inputs: Any) -> int:
    from ..objectives import batch_size_of
    return batch_size_of(inputs)
