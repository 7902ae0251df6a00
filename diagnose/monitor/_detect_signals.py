"""Detectors of the published large-run instabilities, each naming its published cure.

- attention_logit_growth: the largest pre-softmax attention logit of a site above
  `attn_logit_max` (200) and at least `attn_logit_growth` (10) x its smallest sample of the last
  `attn_logit_window` (100) steps: a runaway. On the proxies the runs without qk-norm go from
  0.2 to past 200 in 10-20 steps and reach 1e5-5e7; the qk-normed runs drift past 200 too at lr
  0.3 (steps 505-835 of 1,000), but by at most 3.5x in 100 steps.
  Cure: qk-layernorm (Dehghani et al. 2023; Wortsman et al. 2023).
- logit_divergence: the root mean square of the output log-partition z above `z_rms_max` for
  `z_patience` logged steps.
  Cure: z-loss 1e-4 * z^2 (PaLM; Wortsman et al. 2023).
- update_size: a block's update-to-weight ratio above `update_ratio_max` or below
  `update_ratio_min` for `update_patience` measured steps (attention steps, see _probes_optim.py).
  Cure: the lr and its warmup.
- adam_eps: a block's sqrt(mean v_hat) below `adam_eps_ratio_min` x eps for `update_patience`
  measured steps: eps swamps Adam's denominator. Cure: a smaller eps (Wortsman et al. 2023).

The thresholds are the detectors' own (`defaults`; Thresholds(extra={...}) overrides them); the
proxy sweep in bench/bench_proxies.py and docs/monitor.md shows where they sit between stable and
unstable runs.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from ._detect import Context, Detector, Emit, finite, layer_values


class AttentionLogitGrowth(Detector):
    """A site's largest pre-softmax attention logit above `attn_logit_max` and up `attn_logit_growth`x
    on its smallest sample within the last `attn_logit_window` steps (or, sampled more sparsely,
    on the previous sample): a runaway, not a drift.

    Why the growth and not the level alone: without qk-layernorm the logit is bilinear in the q
    and k weights, which start at std 0.02 and which Adam moves by about the lr per coordinate per
    step, so it multiplies (proxy at lr 0.3: 0.2 to 285 in 10 steps, 1e5 by step 100); with it
    |q| and |k| are sqrt(d_head) x LayerNorm gains that start at 1, so it drifts (7-11 at step 50,
    past 200 at steps 505-835, never more than 3.5x in 100 steps)."""

    kind, severity, lr_first = "attention_logit_growth", "warning", True
    hint = ("attention logits are growing, the divergence qk-layernorm cures: normalise queries and keys "
            "before their dot product (Dehghani et al. 2023; Wortsman et al. 2023), or lower the lr")
    defaults = {"attn_logit_max": 200.0, "attn_logit_growth": 10.0, "attn_logit_window": 100}

    def __init__(self) -> None:
        self.seen: dict[str, deque] = {}  # per site, (step, largest logit) of its samples in the window

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        logits = {site: max(v for v in st["max_logit"] if finite(v))
                  for site, st in (rec.get("attention") or {}).items()
                  if any(finite(v) for v in st.get("max_logit") or [])}
        if not logits:
            return
        step, window = rec["step"], ctx.threshold("attn_logit_window")
        limit, factor = ctx.threshold("attn_logit_max"), ctx.threshold("attn_logit_growth")
        worst = None  # (growth, site, logit, smallest in the window)
        for site, now in logits.items():
            seen = self.seen.setdefault(site, deque())
            while len(seen) > 1 and seen[0][0] < step - window:
                seen.popleft()  # leaves the previous sample when every sample is older than the window
            low = min((v for _, v in seen), default=None)
            seen.append((step, now))
            # a first sample has no window: no growth to judge (a run resumed already past 200 is not alerted)
            if low is not None and now > limit and now >= factor * max(low, 1e-30):
                growth = now / max(low, 1e-30)
                if worst is None or growth > worst[0]:
                    worst = (growth, site, now, low)
        emit(worst is not None, worst[1] if worst else "",
             f"max pre-softmax attention logit of {worst[1]} is {worst[2]:.1f} (> {limit:g}), up from "
             f"{worst[3]:.3g} within {window:g} steps (>= {factor:g}x)" if worst else "")


class LogitDivergence(Detector):
    """The root mean square of the output logits' log-partition z above `z_rms_max`."""

    kind, severity, lr_first = "logit_divergence", "warning", True
    hint = ("the output logits' log-partition z is drifting, the divergence z-loss cures: add "
            "1e-4 * logsumexp(logits)^2 to the loss (PaLM; Wortsman et al. 2023), or lower the lr "
            "(this alert is validated on hand-made records only: no small proxy run has shown a divergence "
            "z-loss cures; docs/monitor.md)")
    defaults = {"z_rms_max": 20.0, "z_patience": 3}

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        sq = rec.get("z_sq_mean")
        if not finite(sq):
            return
        rms, limit = math.sqrt(max(sq, 0.0)), ctx.threshold("z_rms_max")
        # a drift, not one outlier batch: for z_patience logged steps in a row
        on = ctx.persist("logit_divergence", rms > limit, int(ctx.threshold("z_patience")))
        emit(on, "output", f"output log-partition z has rms {rms:.1f} (mean {rec.get('z_mean', 0.0):.1f}, "
                           f"> {limit:g}) for {int(ctx.threshold('z_patience'))} logged steps" if on else "")


class UpdateSize(Detector):
    """A block's update-to-weight ratio outside [update_ratio_min, update_ratio_max] for `update_patience` steps."""

    kind, severity, lr_first = "update_size", "warning", False
    hint = ("the optimizer's updates are out of scale with the weights: too large -- lower the lr or "
            "lengthen the warmup; too small -- the lr has decayed or is too low for these weights")
    defaults = {"update_ratio_max": 0.3, "update_ratio_min": 1e-7, "update_patience": 3}

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        ratios = layer_values(rec, "update_ratio")
        if not ratios:
            return  # not a measured step: the streak carries over
        hi, lo = max(ratios, key=ratios.get), min(ratios, key=ratios.get)
        big = ratios[hi] > ctx.threshold("update_ratio_max")
        small = ratios[lo] < ctx.threshold("update_ratio_min")
        where = hi if big else lo
        on = ctx.persist("update_size", big or small, int(ctx.threshold("update_patience")))
        emit(on, where, f"update-to-weight ratio of {where} is {ratios[where]:.2e} "
                        f"({'above' if big else 'below'} the "
                        f"{ctx.threshold('update_ratio_max' if big else 'update_ratio_min'):g} limit)" if on else "")


class AdamEps(Detector):
    """A block's sqrt(mean v_hat) below `adam_eps_ratio_min` x eps for `update_patience` logged steps."""

    kind, severity, lr_first = "adam_eps", "warning", False
    hint = ("Adam's eps is as large as sqrt(v) of these weights, so it damps their updates: lower eps "
            "(Wortsman et al. 2023 use 1e-15), or check that the gradients are not scaled down")
    defaults = {"adam_eps_ratio_min": 1.0}

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        ratios = layer_values(rec, "adam_rms_v_eps")
        if not ratios:
            return
        lo = min(ratios, key=ratios.get)
        low = ratios[lo] < ctx.threshold("adam_eps_ratio_min")
        on = ctx.persist("adam_eps", low, int(ctx.threshold("update_patience")))
        emit(on, lo, f"sqrt(mean v) of {lo} is {ratios[lo]:.2f} x Adam's eps" if on else "")
