"""The monitor's built-in measurements: the loss, block activations, attention and gradient norms.

Each is a `Measurement` entry with its `Probe` (see _measure.py); _builtins.py registers them in
the order of their parts in the step vector. The probes wrap the
watchers of _signals.py, which own the hooks.
"""

from __future__ import annotations

import math
import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist

from .._activations import STAT_NAMES
from ..adapters.base import TRACED_HOOKS, compile_safe
from ._layout import ACTIVATION_REDUCE, ATTENTION_ROWS, record_key
from ._measure import Measurement, StepInputs, record_field as _f
from ._signals import ActivationWatch, AttentionWatch, GradNorms, scaler_divisor

_PER_SITE = ("uniform_entropy",)  # attention rows that hold one number repeated over heads


class _Quiet:
    """Default arm/discard/remove for probes without hooks or per-step state."""

    def arm(self, step: int, logged: bool, sampled: bool) -> None:
        pass

    def discard(self) -> None:
        pass

    def remove(self) -> None:
        pass


class LossProbe(_Quiet):
    """The loss given to step(); None (not given) is written as null, not a NaN alert."""

    def __init__(self, monitor: Any):
        self.given = True

    def collect(self, inputs: StepInputs) -> torch.Tensor:
        loss = inputs.loss
        self.given = loss is not None
        if isinstance(loss, torch.Tensor):
            return loss.detach().reshape(-1)[:1].reshape(1, 1)  # [1 unit, 1 row]
        return torch.tensor([[math.nan if loss is None else float(loss)]], dtype=torch.float64)

    def write(self, record: dict[str, Any], units: list[dict[str, list[float]]]) -> None:
        record["loss"] = units[0]["loss"][0] if self.given else None


class ActivationProbe(_Quiet):
    """Per block that ran: the activation statistics (STAT_NAMES) of its output, into layers."""

    def __init__(self, monitor: Any):
        self.block_names = monitor.block_names
        self.watch = ActivationWatch(monitor.model, monitor.blocks)
        self.present: list[bool] = []
        self.compiled, self.warned = monitor.compiled, False

    def arm(self, step: int, logged: bool, sampled: bool) -> None:
        self.watch.armed = logged

    def discard(self) -> None:
        self.watch.discard()

    def collect(self, inputs: StepInputs) -> torch.Tensor | None:
        acts, self.present = self.watch.collect()  # [L_present, S] (variance as E[x^2])
        if self.compiled and self.present and not any(self.present) and not self.warned:
            self.warned = True
            warnings.warn(
                f"diagnose: no block ran diagnose's hooks at step {inputs.step} under torch.compile: the "
                "graph was traced without them (before the TrainingMonitor was created, or for another "
                "instance of this model's class, whose graph dynamo reuses), and dynamo does not see hooks "
                "added later. Lost: activation and attention statistics for this run. Fix: create the "
                "TrainingMonitor before the compiled model's first forward, or call "
                "torch._dynamo.reset() after creating it.", RuntimeWarning, stacklevel=4)
        return acts

    def write(self, record: dict[str, Any], units: list[dict[str, list[float]]]) -> None:
        ran = iter(units)
        for name, present in zip(self.block_names, self.present):
            if present:
                row = {k: v[0] for k, v in next(ran).items()}
                var = row["var"] - row["mean"] * row["mean"]  # back from the second moment
                row["var"] = max(var, 0.0) if math.isfinite(var) else var
                record["layers"][name].update({record_key(k): v for k, v in row.items()})

    def remove(self) -> None:
        self.watch.remove()


class AttentionProbe(_Quiet):
    """Per sampled site: per-head entropy and max weight, and the uniform entropy, into attention.

    Under torch.compile (the model given compiled, or compiled after the monitor was attached,
    which the block hooks notice while dynamo traces them) the attention hooks stay in place and
    a switch samples (AttentionWatch.hold). Until the first forward shows whether dynamo traces
    it, the hooks are in place with the switch off (a trainer may compile the model and start on
    an unsampled step: the graph must have them). A sampled step whose blocks ran but whose
    attention hooks did not (a graph traced before they were added) warns once, naming the fix."""

    def __init__(self, monitor: Any):
        self.site_names = monitor.site_names
        self.acts = monitor.probe("activations")
        self.watch = AttentionWatch(monitor.sites, self.acts.watch)
        self.safe = all(compile_safe(site) for site in monitor.sites)
        self.off = False  # attention is not sampled (a compiled model whose attention would break the graph)
        self.pending = bool(monitor.attention_every) and not monitor.compiled and self.safe  # compiled: unknown yet
        if monitor.compiled and not self.safe:
            self._give_up()
        if monitor.compiled or self.pending:
            self.watch.hold()
        may_compile = monitor.compiled or (self.pending and "torch._dynamo" in sys.modules)  # no import paid
        self._dynamo_patch = _checkpoint_side_effects_once() if may_compile and not self.off else None
        if self.pending:
            self.watch.enter()
        self.seen: list = []
        self.warned = False

    def arm(self, step: int, logged: bool, sampled: bool) -> None:
        if sampled and not self.off:
            self.watch.arm()

    def _give_up(self) -> None:
        """Under torch.compile with a family whose attention hook would break the graph: no samples."""
        self.off = True
        self.watch.held = False
        self.watch.disarm()
        families = sorted({site.adapter.family for site in self.watch.sites if not compile_safe(site)})
        newer = "" if TRACED_HOOKS else "torch >= 2.13 (whose dynamo traces diagnose's attention hooks), or "
        warnings.warn(
            f"diagnose: attention statistics are not sampled under torch.compile for {', '.join(families)}: "
            "its attention probabilities are read through hooks this dynamo cannot trace into the graph "
            f"(diagnose's traced hooks need torch >= 2.13; this is {torch.__version__}). "
            "Lost: per-head entropy, max weight and max logit (and "
            "entropy_collapse, attention_logit_growth); activations, gradient norms, the output logits' z "
            f"and the optimizer's update sizes are kept. Fix: {newer}sample attention from an eager "
            "run of the model, or register an adapter whose watch_pattern (or watch_pattern_traced) is a plain module "
            "hook (compile_safe = True, see diagnose/adapters/base.py).", RuntimeWarning, stacklevel=4)

    def _follow_compile(self) -> None:
        """Once dynamo traced the hooks, keep them (those in the graph now run on every call); once
        a forward ran eagerly, go back to hooks on sampled steps only."""
        if self.off:
            return
        if self.acts.watch.traced and not self.safe:
            self._give_up()
        elif self.pending and self.acts.watch.ran:
            self.pending = False
            self.watch.held = self.acts.watch.traced
        elif not self.watch.held and self.acts.watch.traced:
            self.watch.hold()

    def discard(self) -> None:
        self._follow_compile()
        self.watch.discard()

    def collect(self, inputs: StepInputs) -> list:
        self._follow_compile()
        sampled = self.watch.armed
        self.seen = self.watch.collect() if sampled else []  # per site [3, H] or None
        if (sampled and self.acts.watch.traced and not self.warned and any(self.acts.present)
                and self.seen and all(a is None for a in self.seen)):
            self.warned = True
            warnings.warn(
                f"diagnose: no attention statistics at step {inputs.step} under torch.compile: the graph "
                "was traced before diagnose's attention hooks were added, and dynamo does not see hooks "
                "added later. Lost: per-head entropy, max weight and max logit (and entropy_collapse, "
                "attention_logit_growth) for this run. "
                "Fix: create the TrainingMonitor before the compiled model's first forward (or pass it "
                "torch.compile(model)), or call torch._dynamo.reset() after creating it.",
                RuntimeWarning, stacklevel=4)
        return self.seen

    def write(self, record: dict[str, Any], units: list[dict[str, list[float]]]) -> None:
        sampled = [name for name, a in zip(self.site_names, self.seen) if a is not None]
        attention = {site: {row: (v[0] if row in _PER_SITE else v) for row, v in unit.items()}
                     for site, unit in zip(sampled, units)}
        if attention:
            record["attention"] = attention

    def remove(self) -> None:
        self.watch.disarm()
        if self._dynamo_patch is not None:
            patch, self._dynamo_patch = self._dynamo_patch, None
            patch.__exit__(None, None, None)


def _checkpoint_side_effects_once():
    """While the monitor is open, dynamo keeps the attention hooks' writes to Python state in the
    forward of a checkpointed block (torch.utils.checkpoint, a higher-order op under compile) and
    does not replay them in backward's recompute; without it dynamo refuses them and breaks the
    graph at every block. Eager checkpointing replays them, which the watch ignores (a
    recomputation runs with the switch on but sees the same probabilities). Only for a model given
    compiled, or when dynamo is already imported (transformers imports it): importing it costs an
    eager run about 1.4 s. Returns the entered patch, or None where torch has no such setting."""
    config = torch._dynamo.config
    if not hasattr(config, "skip_fwd_side_effects_in_bwd_under_checkpoint"):
        return None
    patch = config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True)
    patch.__enter__()
    return patch


class GradNormProbe(_Quiet):
    """Per-parameter gradient norms (pre-clip, AMP-unscaled) -> the global norm, the clip
    coefficient, per-block norms, and the first parameter whose gradient is not finite."""

    def __init__(self, monitor: Any):
        self.block_names, self.clip = monitor.block_names, monitor.clip
        self.watch = GradNorms(monitor.model, monitor.block_names)
        self.idx: list[int] = []

    def collect(self, inputs: StepInputs) -> list[torch.Tensor]:
        snapshot = inputs.snapshot
        norms, self.idx, sharded = snapshot if snapshot is not None else self.watch.norms()  # [P]
        if norms is None:
            return []
        if any(sharded) and inputs.world > 1:
            norms = _gather_shards(norms, sharded)
        div = scaler_divisor(inputs.scaler, inputs.optimizer) if snapshot is None else None  # a snapshot is unscaled
        if div is not None:
            norms = norms / div.to(norms.device)
        return [norms[None]]  # one unit [1 row, P]

    def write(self, record: dict[str, Any], units: list[dict[str, list[float]]]) -> None:
        norms = units[0]["norm"] if units else []
        owner = self.watch.owner
        sq = [0.0] * len(self.block_names)
        has = [False] * len(self.block_names)
        bad_param = None
        for i, n in zip(self.idx, norms):
            if not math.isfinite(n) and bad_param is None:
                bad_param = self.watch.params[i][0]
            if owner[i] >= 0:
                sq[owner[i]] += n * n
                has[owner[i]] = True
        for name, q, h in zip(self.block_names, sq, has):
            record["layers"][name]["grad_norm"] = math.sqrt(q) if h else None
        grad_norm = math.sqrt(sum(n * n for n in norms)) if norms else None
        record["grad_norm"] = grad_norm
        if self.clip is not None and grad_norm is not None:
            coef = self.clip / (grad_norm + 1e-6)  # as clip_grad_norm_; a NaN norm gives NaN (min() would say 1)
            record["clip_coef"] = coef if math.isnan(coef) else min(1.0, coef)
        if bad_param is not None:
            record["nonfinite_param"] = bad_param  # first parameter (model order) with a NaN/Inf grad


def _gather_shards(norms: torch.Tensor, sharded: list[bool]) -> torch.Tensor:
    """FSDP2: the norm of a sharded gradient from its shards' norms (sum of squares over ranks)."""
    mask = torch.tensor(sharded, device=norms.device)
    sq = norms[mask].square()
    dist.all_reduce(sq)  # SUM
    out = norms.clone()
    out[mask] = sq.sqrt()
    return out


LOSS = Measurement("loss", ("loss",), "model", ("loss",), LossProbe,
                   fields=(_f("loss", "loss", ".6g", plot=True),))
_ACT_LABELS = {"mean": "act mean", "var": "act var", "max_abs": "max |act|", "token_cos": "token cos"}
ACTIVATIONS = Measurement(
    "activations", STAT_NAMES, "layer", tuple(f"layers.*.{record_key(s)}" for s in STAT_NAMES),
    ActivationProbe, reduce=ACTIVATION_REDUCE,
    fields=tuple(_f(record_key(s), _ACT_LABELS.get(s, ""), per="layer", plot=s in ("var", "token_cos"))
                 for s in STAT_NAMES))
ATTENTION = Measurement(
    "attention", ATTENTION_ROWS, "head", tuple(f"attention.*.{r}" for r in ATTENTION_ROWS), AttentionProbe,
    fields=(_f("entropy", "entropy", unit="nats", per="head", plot=True),
            _f("max_weight", "max weight", ".3f", per="head"),
            _f("uniform_entropy", "uniform entropy", unit="nats", per="site")))
# already global after DDP's all-reduce (FSDP2 shards are summed by the probe): not reduced again
GRAD_NORMS = Measurement(
    "grad_norms", ("norm",), "parameter", ("grad_norm", "clip_coef", "layers.*.grad_norm", "nonfinite_param"),
    GradNormProbe, across_ranks=False,
    fields=(_f("grad_norm", "grad norm", plot=True), _f("clip_coef", "clip coef", ".3g"),
            _f("grad_norm", "grad norm", per="layer", plot=True),
            _f("nonfinite_param", "first non-finite gradient", "s")))
