"""The attention detector: entropy_collapse, against the first sample and against uniform attention."""

from __future__ import annotations

import statistics
from typing import Any

from ._detect import Context, Detector, Emit, finite

INIT_COLLAPSE_HINT = ("attention is near one-hot before training has shaped it: the scores are too large from "
                      "the start -- check that they are divided by sqrt(d_k) and the q/k init std (0.02); "
                      "if the run starts from trained weights, Thresholds(init_entropy_frac=0) turns this off")


class EntropyCollapse(Detector):
    """Most heads of a site far below their entropy at the first sample, or, at the first sample,
    far below the entropy of uniform attention over the visible keys (a collapse from init).

    A collapse from init also needs the site's heads alike, their entropies within a factor
    `init_head_spread` of each other: fresh heads are exchangeable (i.i.d. weights), so a scale
    bug collapses them alike (0.170 and 0.186 of uniform, 0.214 and 0.198: the failure suite's
    model without 1/sqrt(d_k) at init std 0.05); trained heads have specialised, sharp beside broad,
    and a pretrained start's sharp heads are its starting level, against which the first-sample
    comparison judges it (all-MiniLM-L6-v2 before fine-tuning: 9 of 12 heads below half of uniform
    in layers 1, 2 and 4, spread 3.4x, 5.6x and 2.9x)."""

    kind, severity, lr_first = "entropy_collapse", "error", True
    hint = ("attention went one-hot in every head: check the 1/sqrt(d_k) scaling of the "
            "scores, lower the lr, add warmup, or normalise queries and keys (qk-norm)")
    reads = ("collapse_entropy_frac", "collapse_head_frac", "init_entropy_frac")
    defaults = {"init_head_spread": 2.0}

    def __init__(self) -> None:
        self.first: dict[str, list[float]] = {}  # per site, the entropy at its first sample

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        attn = rec.get("attention") or {}
        worst = None  # (site, share of heads, mean entropy, reference entropy[, message for init])
        for site, st in attn.items():
            ent = st.get("entropy") or []
            if not ent or not all(finite(v) for v in ent):
                continue
            if site not in self.first:
                init = self._collapsed_at_first_sample(ctx, site, ent, st.get("uniform_entropy"))
                if init is not None:
                    worst = init if worst is None or init[1] > worst[1] else worst
            first = self.first.setdefault(site, list(ent))
            low = [e <= ctx.t.collapse_entropy_frac * f0 for e, f0 in zip(ent, first) if f0 > 0]
            frac = sum(low) / len(low) if low else 0.0
            if frac >= ctx.t.collapse_head_frac and (worst is None or frac > worst[1]):
                worst = (site, frac, statistics.fmean(ent), statistics.fmean(first))
        if attn:
            emit(worst is not None, worst[0] if worst else "",
                 "" if worst is None else worst[4] if len(worst) > 4 else
                 f"{worst[1]:.0%} of the heads of {worst[0]} collapsed: mean attention entropy "
                 f"{worst[2]:.3f} nats, down from {worst[3]:.3f} at the first sample",
                 None if worst is None or len(worst) == 4 else INIT_COLLAPSE_HINT)

    @staticmethod
    def _collapsed_at_first_sample(ctx: Context, site: str, ent: list[float], uniform: Any) -> tuple | None:
        """(site, share of heads, mean entropy, uniform entropy, message) when the site's heads start
        far below uniform attention over their visible keys, else None."""
        t = ctx.t
        if not finite(uniform) or uniform <= 0 or not t.init_entropy_frac:
            return None
        low = [e < t.init_entropy_frac * uniform for e in ent]
        frac = sum(low) / len(low)
        if frac < t.collapse_head_frac or max(ent) > ctx.threshold("init_head_spread") * max(min(ent), 1e-12):
            return None  # not collapsed, or heads unlike each other: trained, not fresh
        mean = statistics.fmean(ent)
        return (site, frac, mean, uniform,
                f"{frac:.0%} of the heads of {site} are collapsed from the first sample: mean attention entropy "
                f"{mean:.3f} nats where uniform attention over the visible keys gives {uniform:.3f}")
