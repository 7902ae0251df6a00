"""Alert detectors: each compares a logged step with the run's own recent history.

Robust statistics throughout: a signal's baseline is the median of its last `window`
finite values and its spread the MAD (scaled by 1.4826 to match a standard deviation on
normal data, floored at `mad_floor` x |median| so that a flat history does not turn noise
into alerts). Every kind fires once, then stays quiet until its condition has cleared and
`cooldown` steps have passed: a run that stays broken produces one alert, not one per step.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from ._divergence import LossTrend, divergence_hint, evidence_first

KINDS = ("nonfinite", "grad_spike", "loss_spike", "divergence", "vanishing_grad", "activation_growth",
         "entropy_collapse", "rank_collapse", "no_warmup")

HINTS = {
    "nonfinite": "find the first op that overflows: lower the lr, keep gradient clipping on, look for "
                 "log/sqrt/div of values that can reach 0, softmax over rows that are fully masked "
                 "(-inf everywhere), or fp16 overflow (use bf16, or a GradScaler)",
    "grad_spike": "clip gradients (torch.nn.utils.clip_grad_norm_(params, 1.0)), lower the lr or add "
                  "warmup; if it repeats, look for bad batches and for attention logits growing (qk-norm)",
    "loss_spike": "a spike usually follows a gradient spike: lower the lr, clip gradients, use a longer "
                  "warmup, and lower Adam's beta2 (0.95) so its second moment reacts faster",
    "divergence": divergence_hint(None, False),
    "vanishing_grad": "the early layers barely learn: add residual connections, check the init scale, avoid "
                      "saturating activations, and, if the blocks are Post-LN, move to Pre-LN (x + f(norm(x)))",
    "activation_growth": "the residual stream is blowing up: lower the lr, scale residual branch init by "
                         "1/sqrt(2 * n_layers), add weight decay, and, if the blocks are Post-LN (x = norm(x + f(x))), "
                         "move to Pre-LN with a final LayerNorm",
    "entropy_collapse": "attention went one-hot in every head: check the 1/sqrt(d_k) scaling of the "
                        "scores, lower the lr, add warmup, or normalise queries and keys (qk-norm)",
    "rank_collapse": "token representations are converging to one vector with depth: the residual "
                     "connections are missing or bypassed (x + f(x), not f(x)), or the stack is too deep "
                     "for its norm placement",
    "no_warmup": "the lr was at full value from the first step: add a linear warmup (e.g. 1-5 % of the "
                 "steps); Post-LN Transformers in particular diverge without it (Xiong et al. 2020)",
}

# grad_spike / loss_spike when the loop clips (a record carries clip_coef): telling the user to clip would be wrong
CLIPPING_SPIKE_HINT = ("the loop already clips gradients; if spikes recur, lower the lr or lengthen the warmup, "
                       "look for bad batches, and for attention logits growing (qk-norm)")
CLIPPING_LOSS_HINT = ("the loop already clips gradients: lower the lr, use a longer warmup, lower Adam's beta2 "
                      "(0.95) so its second moment reacts faster, and look for bad batches at this step")
# a rising loss makes the lr the first suspect of these symptoms (nonfinite and no_warmup say it already)
LR_FIRST = ("grad_spike", "loss_spike", "vanishing_grad", "activation_growth", "entropy_collapse", "rank_collapse")


@dataclass
class Thresholds:
    """When each alert fires. Ratios are relative to the run's own recent history.

    window / min_history: steps of history kept per signal, and needed before spike checks.
    mad_floor: the spread is at least this fraction of |median| (flat histories).
    grad_spike_ratio / grad_spike_mads: global grad norm above ratio x median AND above
        median + mads x MAD.  loss_spike_ratio / loss_spike_mads: the same for the loss.
    vanishing_ratio / vanishing_patience: the smallest block grad norm below ratio x the largest
        for `patience` consecutive logged steps.
    loss_spike_floor: a loss spike must also rise by this fraction of the first logged loss
        (late in a run, 0.004 -> 0.04 is 10x but means nothing).
    diverge_window / diverge_ratio / diverge_floor / diverge_patience: divergence fires when the
        median of the last `window` logged losses has stayed above `ratio` x the run's best such median
        (and above it by `floor` x the first logged loss) for `patience` consecutive logged steps
        (see _divergence.py). Measured: lr 1.0 on the reference model fires 6 steps after the loss
        doubled, in the steep and in the slow scenario of tests/monitor/test_failures.py; no healthy
        or otherwise broken run of that suite trips it.
    grad_spike_floor: likewise, a gradient spike must reach this fraction of the first logged
        grad norm (a converged demo classifier went 0.0012 -> 0.0100: 8x, and nothing to act on).
    growth_ratio: a block's activation variance above growth_ratio x its median over the window.
    collapse_entropy_frac / collapse_head_frac: a site where at least collapse_head_frac of the
        heads have an attention entropy below collapse_entropy_frac x their entropy at the
        first sample (learned sharp heads keep ~20 % of it; collapsed ones drop under 5 %).
    init_entropy_frac: at a site's first attention sample, at least collapse_head_frac of the heads
        below init_entropy_frac x the entropy of uniform attention over the visible keys (log of
        their count, causal and padding masks included) is a collapse from initialisation, which
        the comparison with the first sample cannot see. Fresh heads sit near uniform (ratio ~0.9
        and above); a 128-wide head without 1/sqrt(d_k) measured 0.79 nats against 2.2 (0.36).
        Monitoring that starts from trained weights, whose heads are rightly sharp, may set it to 0.
    rank_cos / rank_patience: a block's mean cosine similarity between positions at least
        rank_cos for `patience` consecutive logged steps, in any block but the last. Measured: true
        collapse (a stack without residuals, lr 0.1) reaches 0.99-1.00 and stays; healthy runs stay
        below: a Post-LN run with warmup at lr 1e-2 peaked at 0.93, and the first block of the
        demo's 2-layer order and padding classifiers, which broadcast one token to every position,
        held 0.975 and 0.953 while reaching 100 % accuracy.
    warmup_check: no_warmup fires when the lr of the second logged step (within this many
        steps of the first) is not above the first; False disables it.
    cooldown: steps before the same kind may fire again (after its condition cleared).
    """

    window: int = 50
    min_history: int = 8
    mad_floor: float = 0.05
    grad_spike_ratio: float = 4.0
    grad_spike_mads: float = 8.0
    loss_spike_ratio: float = 1.5
    loss_spike_mads: float = 8.0
    vanishing_ratio: float = 1e-3
    vanishing_patience: int = 3
    growth_ratio: float = 100.0
    collapse_entropy_frac: float = 0.1
    collapse_head_frac: float = 0.75
    init_entropy_frac: float = 0.5
    loss_spike_floor: float = 0.05
    grad_spike_floor: float = 0.05
    diverge_window: int = 5
    diverge_ratio: float = 2.0
    diverge_floor: float = 0.25
    diverge_patience: int = 5
    rank_cos: float = 0.99
    rank_patience: int = 5
    warmup_check: int | bool = 100
    cooldown: int = 100

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


INIT_COLLAPSE_HINT = ("attention is near one-hot before training has shaped it: the scores are too large from "
                      "the start -- check that they are divided by sqrt(d_k) and the q/k init std (0.02); "
                      "if the run starts from trained weights, Thresholds(init_entropy_frac=0) turns this off")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def robust_center(values) -> tuple[float, float]:
    """(median, scaled MAD) of a sequence of finite floats."""
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values) * 1.4826
    return med, mad


class _Latch:
    """De-duplication of one alert kind: fire once, re-arm after the condition clears and
    `cooldown` steps have passed. (Not the ablation's head gate.)"""

    def __init__(self, cooldown: int):
        self.cooldown, self.active, self.last = cooldown, False, None

    def __call__(self, condition: bool, step: int) -> bool:
        if not condition:
            self.active = False
            return False
        if self.active or (self.last is not None and step - self.last < self.cooldown):
            return False
        self.active, self.last = True, step
        return True


class AlertEngine:
    """Feeds each logged record through every detector; returns the alerts it raises."""

    def __init__(self, thresholds: Thresholds, blocks: list[str]):
        self.t = thresholds
        self.blocks = blocks
        self.latches = {k: _Latch(thresholds.cooldown) for k in KINDS}
        self.hist: dict[str, deque] = {}
        self.streak: dict[str, int] = {}
        self.first_loss: float | None = None  # the scale a loss spike is measured against
        self.first_grad_norm: float | None = None  # ... and a gradient spike
        self.first_lr: tuple[int, float] | None = None
        self.first_attention: dict[str, float] = {}
        self.lr_checked = False
        self.trend = LossTrend(thresholds.diverge_window, thresholds.diverge_ratio, thresholds.diverge_floor)

    def _h(self, key: str) -> deque:
        if key not in self.hist:
            self.hist[key] = deque(maxlen=self.t.window)
        return self.hist[key]

    def _push(self, key: str, value: Any) -> None:
        if _finite(value):
            self._h(key).append(float(value))

    def _spike(self, key: str, value: Any, ratio: float, mads: float) -> float | None:
        """value / median when value is a spike against the history of `key`, else None."""
        h = self._h(key)
        if not _finite(value) or len(h) < self.t.min_history or value <= ratio * min(h):
            return None  # (the median is >= the minimum: no spike possible, no sort needed)
        med, mad = robust_center(h)
        spread = max(mad, self.t.mad_floor * abs(med))
        if med > 0 and value > ratio * med and value > med + mads * spread:
            return value / med
        return None

    def _persist(self, key: str, condition: bool, patience: int) -> bool:
        self.streak[key] = self.streak.get(key, 0) + 1 if condition else 0
        return self.streak[key] >= patience

    def check(self, rec: dict[str, Any], *, amp: bool = False) -> list[dict[str, Any]]:
        """Alerts for this record; the record's values then join the history."""
        out: list[dict[str, Any]] = []
        step = rec["step"]

        def emit(kind: str, condition: bool, severity: str, where: str, message: str,
                 hint: str | None = None) -> None:
            if self.latches[kind](condition, step):
                hint = hint or HINTS[kind]
                if kind in LR_FIRST and self.trend.rising:
                    hint = evidence_first(hint, self.trend, rec.get("lr"))
                out.append({"step": step, "kind": kind, "severity": severity, "where": where,
                            "message": message, "hint": hint})

        if not self._check_nonfinite(rec, amp, emit):
            return out  # everything downstream of a NaN is NaN: other detectors would only echo it
        layers = rec.get("layers") or {}
        self.trend.push(step, rec.get("loss"))  # before the others: their hints depend on it
        self._check_grad_spike(rec, layers, emit)
        self._check_loss_spike(rec, emit)
        self._check_divergence(rec, emit)
        self._check_vanishing(layers, emit)
        self._check_growth(layers, emit)
        self._check_attention(rec, emit)
        self._check_rank(layers, emit)
        self._check_warmup(rec, emit)
        self._push("grad_norm", rec.get("grad_norm"))
        self._push("loss", rec.get("loss"))
        for n, st in layers.items():
            self._push(f"var/{n}", st.get("act_var"))
            self._push(f"gn/{n}", st.get("grad_norm"))
        return out

    def _check_nonfinite(self, rec: dict[str, Any], amp: bool, emit) -> bool:
        """Emits nonfinite; True when the step is finite (the other detectors may run)."""
        bad = self._nonfinite_where(rec, amp)
        emit("nonfinite", bad is not None, "error", bad or "",
             f"NaN/Inf first seen at step {rec['step']} in {bad}")
        return bad is None

    def _check_grad_spike(self, rec: dict[str, Any], layers: dict[str, Any], emit) -> None:
        gn = rec.get("grad_norm")
        if self.first_grad_norm is None and _finite(gn):
            self.first_grad_norm = gn
        r = self._spike("grad_norm", gn, self.t.grad_spike_ratio, self.t.grad_spike_mads)
        if r is not None and gn < self.t.grad_spike_floor * (self.first_grad_norm or 0.0):
            r = None  # a spike of a converged run's tiny gradients is noise on the run's scale
        where = self._spiking_block(layers) if r is not None else ""
        coef = rec.get("clip_coef")  # present when the loop told the monitor it clips
        clipping = ("" if not _finite(coef) else f"; clipping scaled the update by {coef:.2g}" if coef < 1.0
                    else "; under the clipping threshold, the update was not scaled")
        emit("grad_spike", r is not None, "warning", where,
             f"gradient norm {gn:.3g} is {r:.1f}x its recent median{clipping}" if r else "",
             CLIPPING_SPIKE_HINT if clipping else None)

    def _check_loss_spike(self, rec: dict[str, Any], emit) -> None:
        loss = rec.get("loss")
        if self.first_loss is None and _finite(loss):
            self.first_loss = loss
        r = self._spike("loss", loss, self.t.loss_spike_ratio, self.t.loss_spike_mads)
        if r is not None and loss - loss / r < self.t.loss_spike_floor * abs(self.first_loss or 0.0):
            r = None  # 0.004 -> 0.04 near convergence is noise, not a spike: it must matter on the run's scale
        emit("loss_spike", r is not None, "warning", "loss",
             f"loss {loss:.4g} is {r:.2f}x its recent median" if r else "",
             CLIPPING_LOSS_HINT if _finite(rec.get("clip_coef")) else None)

    def _check_divergence(self, rec: dict[str, Any], emit) -> None:
        t = self.trend
        held = self._persist("diverge", t.rising, self.t.diverge_patience)
        message = ""
        if held:
            times = f", {t.smoothed / t.best:.1f}x its best," if t.best > 0 else ""
            message = (f"the loss is diverging: the median of the last {len(t.recent)} logged losses went "
                       f"{t.describe()}{times} and has stayed up for {self.t.diverge_patience} logged steps")
        emit("divergence", held, "error", "loss", message,
             divergence_hint(rec.get("lr"), _finite(rec.get("clip_coef"))) if held else None)

    def _check_vanishing(self, layers: dict[str, Any], emit) -> None:
        gnorms = {n: st.get("grad_norm") for n, st in layers.items() if _finite(st.get("grad_norm"))}
        lo = min(gnorms, key=gnorms.get) if gnorms else None
        hi = max(gnorms.values()) if gnorms else 0.0
        vanish = lo is not None and hi > 0 and gnorms[lo] < self.t.vanishing_ratio * hi
        emit("vanishing_grad", self._persist("vanish", vanish, self.t.vanishing_patience), "warning",
             lo or "", f"grad norm of {lo} is {gnorms[lo] / hi:.1e} of the largest block's" if vanish else "")

    def _check_growth(self, layers: dict[str, Any], emit) -> None:
        grown = [(n, st["act_var"] / m) for n, st in layers.items()
                 if _finite(st.get("act_var")) and len(h := self._h(f"var/{n}")) >= self.t.min_history
                 and st["act_var"] > self.t.growth_ratio * min(h)  # cheap pre-check before the median
                 and (m := statistics.median(h)) > 0 and st["act_var"] > self.t.growth_ratio * m]
        emit("activation_growth", bool(grown), "warning", grown[0][0] if grown else "",
             f"activation variance of {grown[0][0]} is {grown[0][1]:.0f}x its recent median" if grown else "")

    def _check_rank(self, layers: dict[str, Any], emit) -> None:
        # the last block is exempt: a pooled classifier's last block rightly converges on its answer,
        # and a true collapse (no residuals, divergence) shows in the blocks before it too
        watched = list(layers.items())[:-1] if len(layers) > 1 else list(layers.items())
        cos = [(n, st["token_cos"]) for n, st in watched if _finite(st.get("token_cos"))]
        collapsed = [(n, c) for n, c in cos if c >= self.t.rank_cos]
        emit("rank_collapse", self._persist("rank", bool(collapsed), self.t.rank_patience), "error",
             collapsed[0][0] if collapsed else "",
             f"mean cosine similarity between token positions is {collapsed[0][1]:.3f} at "
             f"{collapsed[0][0]} (1 = all positions identical)" if collapsed else "")

    def _nonfinite_where(self, rec: dict[str, Any], amp: bool) -> str | None:
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

    def _spiking_block(self, layers: dict[str, Any]) -> str:
        """The block whose grad norm grew most against its own median (its history is pushed here)."""
        best, best_r = "", 0.0
        for n, s in layers.items():
            h = self._h(f"gn/{n}")
            v = s.get("grad_norm")
            if _finite(v) and h:
                med = statistics.median(h)
                if med > 0 and v / med > best_r:
                    best, best_r = n, v / med
        return best or "global"

    def _check_attention(self, rec: dict[str, Any], emit) -> None:
        attn = rec.get("attention") or {}
        worst = None
        for site, st in attn.items():
            ent = st.get("entropy") or []
            if not ent or not all(_finite(v) for v in ent):
                continue
            if site not in self.first_attention:
                init = self._collapsed_at_first_sample(site, ent, st.get("uniform_entropy"))
                if init is not None:
                    worst = init if worst is None or init[1] > worst[1] else worst
            first = self.first_attention.setdefault(site, list(ent))  # entropy at the first sample
            low = [e <= self.t.collapse_entropy_frac * f0 for e, f0 in zip(ent, first) if f0 > 0]
            frac = sum(low) / len(low) if low else 0.0
            if frac >= self.t.collapse_head_frac and (worst is None or frac > worst[1]):
                worst = (site, frac, statistics.fmean(ent), statistics.fmean(first))
        if attn:
            emit("entropy_collapse", worst is not None, "error", worst[0] if worst else "",
                 "" if worst is None else worst[4] if len(worst) > 4 else
                 f"{worst[1]:.0%} of the heads of {worst[0]} collapsed: mean attention entropy "
                 f"{worst[2]:.3f} nats, down from {worst[3]:.3f} at the first sample",
                 None if worst is None or len(worst) == 4 else INIT_COLLAPSE_HINT)

    def _collapsed_at_first_sample(self, site: str, ent: list[float], uniform: Any) -> tuple | None:
        """(site, share of heads, mean entropy, uniform entropy, message) when the site's heads start
        far below uniform attention over their visible keys, else None."""
        if not _finite(uniform) or uniform <= 0 or not self.t.init_entropy_frac:
            return None
        low = [e < self.t.init_entropy_frac * uniform for e in ent]
        frac = sum(low) / len(low)
        if frac < self.t.collapse_head_frac:
            return None
        mean = statistics.fmean(ent)
        return (site, frac, mean, uniform,
                f"{frac:.0%} of the heads of {site} are collapsed from the first sample: mean attention entropy "
                f"{mean:.3f} nats where uniform attention over the visible keys gives {uniform:.3f}")

    def _check_warmup(self, rec: dict[str, Any], emit) -> None:
        lr = rec.get("lr")
        if self.lr_checked or not self.t.warmup_check or not _finite(lr):
            return
        if self.first_lr is None:
            self.first_lr = (rec["step"], float(lr))
            return
        self.lr_checked = True
        step0, lr0 = self.first_lr
        flat = rec["step"] - step0 <= self.t.warmup_check and lr0 > 0 and lr <= lr0
        emit("no_warmup", flat, "warning", "lr",
             f"the lr was {lr0:.3g} at step {step0} and has not increased since (no warmup)")


def format_alert(alert: dict[str, Any]) -> str:
    """One alert as two lines of text: what and where, then the hint."""
    return (f"diagnose [{alert['severity']}] step {alert['step']} {alert['kind']} at {alert['where']}: "
            f"{alert['message']}\n  hint: {alert['hint']}")


def print_alert(alert: dict[str, Any]) -> None:
    print(format_alert(alert), file=sys.stderr, flush=True)
