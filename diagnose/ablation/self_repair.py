"""Each head's direct effect beside its total effect: the same tests, `self_repair`, `compensated`.

The direct-path outcomes (direct.py) sit in an Accumulator like the sweep's, so the paired tests,
bootstrap intervals and multiple-testing correction of accumulate.py apply to them unchanged.
`self_repair = direct_delta_loss - delta_loss`: how much of the loss the head's direct path carries
that the rest of the model restores when the head is gone. A head is `compensated` when its direct
effect matters (significant, and outside the negligible band: verdict.py's one language) but its total effect does not: the
head the seed's lesson would call negligible although the output reads it.
"""

from __future__ import annotations

import numpy as np

from .accumulate import Accumulator, paired_tests
from . import contrast, verdict
from .result import HeadEffect


def add_direct(heads: list[HeadEffect], acc: Accumulator, covered: list[int], band: dict, *, alpha: float,
               n_boot: int, seed: int, correction: str) -> None:
    """Fill the direct fields of the heads whose global index is in `covered` (heads in global order)."""
    idx = np.array(sorted(int(m) for m in covered), dtype=int)
    arrays = acc.arrays()
    tests = paired_tests(arrays, idx, alpha=alpha, n_boot=n_boot, seed=seed, correction=correction)
    loss_sum, correct, _, ab_loss, ab_correct = arrays
    units = acc.units()
    for j, m in enumerate(idx):
        h = heads[m]
        h.direct_delta_loss = float(ab_loss[:, m].sum() - loss_sum.sum()) / units
        h.direct_delta_accuracy = float(ab_correct[:, m].sum() - correct.sum()) / units
        h.direct_delta_loss_ci = [float(tests["loss_ci"][j, 0]), float(tests["loss_ci"][j, 1])]
        h.direct_delta_accuracy_ci = [float(tests["ci"][j, 0]), float(tests["ci"][j, 1])]
        h.direct_p_value_loss = float(tests["p_loss"][j])
        h.direct_p_value_loss_adjusted = float(tests["p_loss_adj"][j])
        h.direct_significant = bool(tests["p_loss_adj"][j] < alpha)
        if h.verified:
            h.self_repair = h.direct_delta_loss - h.delta_loss
            direct_negligible = contrast.equivalent(h.direct_delta_loss, h.direct_delta_loss_ci,
                                                    h.direct_delta_accuracy, h.direct_delta_accuracy_ci, band)
            direct = verdict.classify(h.direct_significant, direct_negligible, h.direct_delta_loss,
                                      h.direct_delta_accuracy, band)
            h.compensated = direct == verdict.MATTERS and h.verdict != verdict.MATTERS
