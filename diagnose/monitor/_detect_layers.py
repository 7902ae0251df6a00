"""Detectors of the blocks and the schedule: vanishing_grad, activation_growth, rank_collapse, no_warmup."""

from __future__ import annotations

import statistics
from typing import Any

from ._detect import Context, Detector, Emit, finite, layer_values


class VanishingGrad(Detector):
    """The smallest block gradient norm far below the largest, for `vanishing_patience` logged steps."""

    kind, severity, lr_first = "vanishing_grad", "warning", True
    hint = ("the early layers barely learn: add residual connections, check the init scale, avoid "
            "saturating activations, and, if the blocks are Post-LN, move to Pre-LN (x + f(norm(x)))")
    reads = ("vanishing_ratio", "vanishing_patience")

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        gnorms = layer_values(rec, "grad_norm")
        lo = min(gnorms, key=gnorms.get) if gnorms else None
        hi = max(gnorms.values()) if gnorms else 0.0
        vanish = lo is not None and hi > 0 and gnorms[lo] < ctx.t.vanishing_ratio * hi
        emit(ctx.persist("vanish", vanish, ctx.t.vanishing_patience), lo or "",
             f"grad norm of {lo} is {gnorms[lo] / hi:.1e} of the largest block's" if vanish else "")


class ActivationGrowth(Detector):
    """A block's activation variance above `growth_ratio` x its recent median.

    Until the block's history holds `window` values, "recent" is its last `min_history`: a stream
    starting from a 0.02-std init (variance ~2e-3) grows polynomially as Adam moves every weight by
    about the lr per step, and a median over the whole early history is the init's scale, not a
    level (qk-normed byte proxy at lr 3e-2, loss falling: x1e6 in 40 steps, 126x that median at
    step 23, never more than 31x its last 8 values, 12x once the window is full)."""

    kind, severity, lr_first = "activation_growth", "warning", True
    hint = ("the residual stream is blowing up: lower the lr, scale residual branch init by "
            "1/sqrt(2 * n_layers), add weight decay, and, if the blocks are Post-LN (x = norm(x + f(x))), "
            "move to Pre-LN with a final LayerNorm")
    reads = ("growth_ratio", "window", "min_history")

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        layers, t = rec.get("layers") or {}, ctx.t
        grown = [(n, st["act_var"] / m) for n, st in layers.items()
                 if finite(st.get("act_var")) and len(h := ctx.h(f"var/{n}")) >= t.min_history
                 and st["act_var"] > t.growth_ratio * min(h)  # cheap pre-check before the median
                 and (m := _recent_median(h, t)) > 0 and st["act_var"] > t.growth_ratio * m]
        emit(bool(grown), grown[0][0] if grown else "",
             f"activation variance of {grown[0][0]} is {grown[0][1]:.0f}x its recent median" if grown else "")
        for n, st in layers.items():
            ctx.push(f"var/{n}", st.get("act_var"))


def _recent_median(h, t) -> float:
    """The median of the whole window once it is full, else of the last min_history values."""
    return statistics.median(h if len(h) >= t.window else list(h)[-t.min_history:])


class RankCollapse(Detector):
    """Token representations converging to one vector: cosine between positions near 1 in a block.

    Collapsed from the first sample on (no residuals, a stack too deep for its norms): after
    `rank_patience` logged steps. A block that starts below `rank_cos` and rises to it is, early in
    training, in the unigram phase: every position predicts the same next-token distribution, so the
    stream aligns on one direction until the model learns to use context (qk-normed byte proxies:
    0.09 at init, >= 0.99 for at most 11 logged steps in a row at lr 1e-2 and 3e-2, then 0.5-0.7 by step 60).
    Such a block must hold it for `rank_grace` logged steps."""

    kind, severity, lr_first = "rank_collapse", "error", True
    hint = ("token representations are converging to one vector with depth: the residual "
            "connections are missing or bypassed (x + f(x), not f(x)), or the stack is too deep "
            "for its norm placement")
    reads = ("rank_cos", "rank_patience")
    defaults = {"rank_grace": 50}

    def __init__(self) -> None:
        self.from_start: dict[str, bool] = {}  # per block, whether its first sample was already collapsed

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        layers = rec.get("layers") or {}
        # the last block is exempt: a pooled classifier's last block rightly converges on its answer,
        # and a true collapse (no residuals, divergence) shows in the blocks before it too
        watched = list(layers.items())[:-1] if len(layers) > 1 else list(layers.items())
        cos = [(n, st["token_cos"]) for n, st in watched if finite(st.get("token_cos"))]
        for n, c in cos:
            self.from_start.setdefault(n, c >= ctx.t.rank_cos)
        grace = int(ctx.threshold("rank_grace"))
        fired = None
        for n, c in cos:  # each block its own streak: from the start, rank_patience; risen to it, rank_grace
            need = ctx.t.rank_patience if self.from_start[n] else max(ctx.t.rank_patience, grace)
            if ctx.persist(f"rank/{n}", c >= ctx.t.rank_cos, need) and fired is None:
                fired = (n, c, need)
        emit(fired is not None, fired[0] if fired else "",
             f"mean cosine similarity between token positions is {fired[1]:.3f} at {fired[0]} "
             f"(1 = all positions identical) for {fired[2]} logged steps" if fired else "")


class NoWarmup(Detector):
    """The lr of the second logged step (within `warmup_check` steps) not above the first."""

    kind, severity = "no_warmup", "warning"
    hint = ("the lr was at full value from the first step: add a linear warmup (e.g. 1-5 % of the "
            "steps); Post-LN Transformers in particular diverge without it (Xiong et al. 2020)")
    reads = ("warmup_check",)

    def __init__(self) -> None:
        self.first: tuple[int, float] | None = None
        self.checked = False

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        lr = rec.get("lr")
        if self.checked or not ctx.t.warmup_check or not finite(lr):
            return
        if self.first is None:
            self.first = (rec["step"], float(lr))
            return
        self.checked = True
        step0, lr0 = self.first
        flat = rec["step"] - step0 <= ctx.t.warmup_check and lr0 > 0 and lr <= lr0
        emit(flat, "lr", f"the lr was {lr0:.3g} at step {step0} and has not increased since (no warmup)")
