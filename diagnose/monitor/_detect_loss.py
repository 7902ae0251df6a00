"""Detectors of the loss and the global gradient norm: nonfinite, grad_spike, loss_spike, divergence."""

from __future__ import annotations

import math
import statistics
from typing import Any

from ._detect import Context, Detector, Emit, finite
from ._divergence import divergence_hint

# grad_spike / loss_spike when the loop clips (a record carries clip_coef): telling the user to clip would be wrong
CLIPPING_SPIKE_HINT = ("the loop already clips gradients; if spikes recur, lower the lr or lengthen the warmup, "
                       "look for bad batches, and for attention logits growing (qk-norm)")
CLIPPING_LOSS_HINT = ("the loop already clips gradients: lower the lr, use a longer warmup, lower Adam's beta2 "
                      "(0.95) so its second moment reacts faster, and look for bad batches at this step")


class Nonfinite(Detector):
    """NaN/Inf in the activations, the loss or (without a GradScaler) the gradients."""

    kind, severity, gate, every_step = "nonfinite", "error", True, True
    hint = ("find the first op that overflows: lower the lr, keep gradient clipping on, look for "
            "log/sqrt/div of values that can reach 0, softmax over rows that are fully masked "
            "(-inf everywhere), or fp16 overflow (use bf16, or a GradScaler)")

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> bool:
        bad = where(rec, ctx.amp)
        emit(bad is not None, bad or "", f"NaN/Inf first seen at step {rec['step']} in {bad}")
        return bad is not None


def where(rec: dict[str, Any], amp: bool) -> str | None:
    """Where the first NaN/Inf of this step is: the first block (forward order) whose
    activations are not finite, else the first parameter with a non-finite gradient,
    else the loss. Under a GradScaler an Inf gradient alone is a skipped step, not an error."""
    for name, s in (rec.get("layers") or {}).items():
        if any(k.startswith("act_") and isinstance(v, float) and not math.isfinite(v) for k, v in s.items()):
            return name
    loss = rec.get("loss")
    if isinstance(loss, float) and not math.isfinite(loss):
        return "loss"
    gn = rec.get("grad_norm")
    if not amp and isinstance(gn, float) and not math.isfinite(gn):
        return rec.get("nonfinite_param") or "gradients"
    return None


class GradSpike(Detector):
    """The global gradient norm far above its recent median, and large on the run's own scale."""

    kind, severity, lr_first, every_step = "grad_spike", "warning", True, True
    hint = ("clip gradients (torch.nn.utils.clip_grad_norm_(params, 1.0)), lower the lr or add "
            "warmup; if it repeats, look for bad batches and for attention logits growing (qk-norm)")
    reads = ("grad_spike_ratio", "grad_spike_mads", "grad_spike_floor", "window", "min_history", "mad_floor")

    def __init__(self) -> None:
        self.first: float | None = None  # the first logged grad norm: the scale a spike must matter on

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        t, gn, layers = ctx.t, rec.get("grad_norm"), rec.get("layers") or {}
        if self.first is None and finite(gn):
            self.first = gn
        r = ctx.spike("grad_norm", gn, t.grad_spike_ratio, t.grad_spike_mads)
        if r is not None and gn < t.grad_spike_floor * (self.first or 0.0):
            r = None  # a spike of a converged run's tiny gradients is noise on the run's scale
        where_ = _spiking_block(ctx, layers) if r is not None else ""
        coef = rec.get("clip_coef")  # present when the loop told the monitor it clips
        clipping = ("" if not finite(coef) else f"; clipping scaled the update by {coef:.2g}" if coef < 1.0
                    else "; under the clipping threshold, the update was not scaled")
        emit(r is not None, where_, f"gradient norm {gn:.3g} is {r:.1f}x its recent median{clipping}" if r else "",
             CLIPPING_SPIKE_HINT if clipping else None)
        ctx.push("grad_norm", gn)
        for n, st in layers.items():
            ctx.push(f"gn/{n}", st.get("grad_norm"))


def _spiking_block(ctx: Context, layers: dict[str, Any]) -> str:
    """The block whose grad norm grew most against its own median."""
    best, best_r = "", 0.0
    for n, s in layers.items():
        h = ctx.h(f"gn/{n}")
        v = s.get("grad_norm")
        if finite(v) and h:
            med = statistics.median(h)
            if med > 0 and v / med > best_r:
                best, best_r = n, v / med
    return best or "global"


class LossSpike(Detector):
    """The loss far above its recent median, by a step that matters on the run's own scale."""

    kind, severity, lr_first, every_step = "loss_spike", "warning", True, True
    hint = ("a spike usually follows a gradient spike: lower the lr, clip gradients, use a longer "
            "warmup, and lower Adam's beta2 (0.95) so its second moment reacts faster")
    reads = ("loss_spike_ratio", "loss_spike_mads", "loss_spike_floor", "window", "min_history", "mad_floor")

    def __init__(self) -> None:
        self.first: float | None = None  # the first logged loss

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        t, loss = ctx.t, rec.get("loss")
        if self.first is None and finite(loss):
            self.first = loss
        r = ctx.spike("loss", loss, t.loss_spike_ratio, t.loss_spike_mads)
        if r is not None and loss - loss / r < t.loss_spike_floor * abs(self.first or 0.0):
            r = None  # 0.004 -> 0.04 near convergence is noise, not a spike: it must matter on the run's scale
        emit(r is not None, "loss", f"loss {loss:.4g} is {r:.2f}x its recent median" if r else "",
             CLIPPING_LOSS_HINT if finite(rec.get("clip_coef")) else None)
        ctx.push("loss", loss)


class Divergence(Detector):
    """The smoothed loss held far above its best for `diverge_patience` steps (_divergence.py)."""

    kind, severity, every_step = "divergence", "error", True  # the loss alone: judged on every step
    hint = divergence_hint(None, False)
    reads = ("diverge_window", "diverge_ratio", "diverge_floor", "diverge_patience")

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        t = ctx.trend
        held = ctx.persist("diverge", t.rising, ctx.t.diverge_patience)
        message = ""
        if held:
            times = f", {t.smoothed / t.best:.1f}x its best," if t.best > 0 else ""
            message = (f"the loss is diverging: the median of the last {len(t.recent)} logged losses went "
                       f"{t.describe()}{times} and has stayed up for {ctx.t.diverge_patience} logged steps")
        emit(held, "loss", message, divergence_hint(rec.get("lr"), finite(rec.get("clip_coef"))) if held else None)
