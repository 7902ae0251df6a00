"""Detectors of the published large-run instabilities, each naming its published cure.

- attention_logit_growth: the largest pre-softmax attention logit of a site above
  `attn_logit_max` (200: the proxies' qk-normed runs stay below 100 up to lr 0.3, the runs
  without qk-norm pass 200 within 50 steps from lr 0.03).
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
from typing import Any

from ._detect import Context, Detector, Emit, finite


class AttentionLogitGrowth(Detector):
    """Any head's largest pre-softmax attention logit above `attn_logit_max` (at a sampled step)."""

    kind, severity, lr_first = "attention_logit_growth", "warning", True
    hint = ("attention logits are growing, the divergence qk-layernorm cures: normalise queries and keys "
            "before their dot product (Dehghani et al. 2023; Wortsman et al. 2023), or lower the lr")
    defaults = {"attn_logit_max": 200.0}

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        logits = {site: max(v for v in st["max_logit"] if finite(v))
                  for site, st in (rec.get("attention") or {}).items()
                  if any(finite(v) for v in st.get("max_logit") or [])}
        if not logits:
            return
        site = max(logits, key=logits.get)
        limit = ctx.threshold("attn_logit_max")
        emit(logits[site] > limit, site,
             f"max pre-softmax attention logit of {site} is {logits[site]:.1f} (> {limit:g})")


class LogitDivergence(Detector):
    """The root mean square of the output logits' log-partition z above `z_rms_max`."""

    kind, severity, lr_first = "logit_divergence", "warning", True
    hint = ("the output logits' log-partition z is drifting, the divergence z-loss cures: add "
            "1e-4 * logsumexp(logits)^2 to the loss (PaLM; Wortsman et al. 2023), or lower the lr")
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
        ratios = {n: st["update_ratio"] for n, st in (rec.get("layers") or {}).items()
                  if finite(st.get("update_ratio"))}
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
        ratios = {n: st["adam_rms_v_eps"] for n, st in (rec.get("layers") or {}).items()
                  if finite(st.get("adam_rms_v_eps"))}
        if not ratios:
            return
        lo = min(ratios, key=ratios.get)
        low = ratios[lo] < ctx.threshold("adam_eps_ratio_min")
        on = ctx.persist("adam_eps", low, int(ctx.threshold("update_patience")))
        emit(on, lo, f"sqrt(mean v) of {lo} is {ratios[lo]:.2f} x Adam's eps" if on else "")
