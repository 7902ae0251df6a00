"""Each exactly patched edge's evidence, the heads' tests carried over unchanged (ablation/accumulate.py):
the change in loss and accuracy per unit with 95 % paired-bootstrap intervals over examples, the
sign-flip permutation test on the per-example change in loss (which decides `significant`) and the
sign test on accuracy, both corrected across the edges tested (Holm or BH), and the verdict by the one
`classify` rule (ablation/verdict.py) with the heads' negligible band (ablation/contrast.default_band).
Where the data names a wrong answer per unit (`wrong_labels`), also the task metric: the logit difference
label - wrong answer with the edge removed, its change and 95 % interval (the heads' own, accumulate.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..ablation import contrast
from ..ablation.accumulate import logit_diff_changes, paired_tests
from ..ablation.verdict import classify
from .edges import Edge


@dataclass
class EdgeEffect:
    """One edge removed alone (path patching), its tests and verdict; `estimate` is the edge attribution's
    delta loss (None where none was computed)."""

    edge: Edge
    delta_loss: float | None = None
    delta_loss_ci: list[float] | None = None
    delta_accuracy: float | None = None
    delta_accuracy_ci: list[float] | None = None
    p_value_loss: float | None = None
    p_value_loss_adjusted: float | None = None
    p_value: float | None = None
    p_value_adjusted: float | None = None
    significant: bool | None = None
    negligible: bool | None = None
    verdict: str | None = None
    estimate: float | None = None
    logit_diff: float | None = None  # label - wrong answer per unit with the edge removed (None: no wrong answers)
    delta_logit_diff: float | None = None
    delta_logit_diff_ci: list[float] | None = None
    verified: bool = False
    in_circuit: bool = False
    inclusion: float | None = None  # share of bootstrap resamples whose minimal circuit holds it
    effect_in_circuit: float | None = None  # delta loss of removing it from the minimal circuit
    self_repair_gap: float | None = None  # effect_in_circuit - delta_loss

    def to_json(self) -> dict[str, Any]:
        out = self.edge.to_json()
        out.update({k: v for k, v in self.__dict__.items() if k != "edge"})
        return out


def edge_effects(measured: Any, edges: Sequence[Edge], *, alpha: float, n_boot: int, seed: int,
                 correction: str, band: dict[str, float]) -> list[EdgeEffect]:
    """One EdgeEffect per edge, column j of the removed sets of `measured` (patch.Measured) being edges[j]."""
    arrays = (measured.loss_sum, measured.correct, measured.count, measured.set_loss, measured.set_correct)
    tests = paired_tests(arrays, np.arange(len(edges)), alpha=alpha, n_boot=n_boot, seed=seed, correction=correction)
    loss_sum, correct, count, ab_loss, ab_correct = arrays
    units = float(max(count.sum(), 1.0))
    diffs = {} if measured.diff is None else logit_diff_changes(measured.diff, measured.diff_count, measured.set_diff,
                                                                np.arange(len(edges)), n_boot=n_boot, seed=seed)
    out = []
    for j, edge in enumerate(edges):
        e = EdgeEffect(edge, verified=True,
                       delta_loss=float(ab_loss[:, j].sum() - loss_sum.sum()) / units,
                       delta_loss_ci=[float(x) for x in tests["loss_ci"][j]],
                       delta_accuracy=float(ab_correct[:, j].sum() - correct.sum()) / units,
                       delta_accuracy_ci=[float(x) for x in tests["ci"][j]],
                       p_value_loss=float(tests["p_loss"][j]), p_value_loss_adjusted=float(tests["p_loss_adj"][j]),
                       p_value=float(tests["p"][j]), p_value_adjusted=float(tests["p_adj"][j]),
                       significant=bool(tests["p_loss_adj"][j] < alpha), **diffs.get(j, {}))
        e.negligible = contrast.equivalent(e.delta_loss, e.delta_loss_ci, e.delta_accuracy, e.delta_accuracy_ci, band)
        e.verdict = classify(e.significant, e.negligible, e.delta_loss, e.delta_accuracy, band)
        out.append(e)
    return out
