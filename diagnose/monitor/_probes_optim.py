"""Per block, what the optimizer step did: the update-to-weight ratio and Adam's sqrt(v) against eps.

Taken from the optimizer itself, with a step pre-hook and a step post-hook registered the first
time step() is given the optimizer (removed in remove()). They run only around the optimizer
step that comes right before an attention step's forward (armed by arm(); every logged step when
attention_every=0), so the record of step s holds the update made at the end of step s-1 -- the
one whose effect the step's forward saw. Sampled like attention because the pre-hook copies the
block weights: at every step that copy alone would cost about 1 % of a small model's step.

- update_ratio: ||W_after - W_before|| / ||W_after|| over the block's parameters. Too large (the
  lr is too high for these weights, or warmup is missing) or too small (the block has stopped
  learning) names the learning rate and its schedule as the cure.
- adam_rms_v_eps: sqrt(mean(v_hat)) / eps over the block's parameters (v_hat: Adam's bias-
  corrected second moment): the typical sqrt(v) in units of eps. Near 1 or below, eps swamps
  the denominator and the update shrinks by half or more; Wortsman et al. 2023 lower eps.

Everything stays on the device (foreach norms, an index_add per block): no host sync. FSDP2's
sharded (DTensor) parameters are left out: their norms would need a sum across ranks.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ._measure import Measurement, StepInputs, record_field as _f


def _bias_correction(state: dict, beta2: float) -> torch.Tensor | float:
    """1 - beta2^step; step is a CPU tensor (or a device tensor when capturable): no host sync."""
    step = state.get("step", 1)
    if isinstance(step, torch.Tensor) and step.device.type != "cpu":
        return 1 - beta2 ** step.double()
    return 1 - beta2 ** float(step)


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer inside a trainer's wrapper (accelerate's AcceleratedOptimizer `.optimizer`,
    Lightning's LightningOptimizer `._optimizer`), or None when there is none."""
    for _ in range(4):
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None or inner is optimizer:
            break
        optimizer = inner  # (AcceleratedOptimizer subclasses Optimizer but has no hooks of its own)
    ok = isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "_optimizer_step_pre_hooks")
    return optimizer if ok else None


class OptimizerProbe:
    """Update-to-weight ratio and Adam's sqrt(v) / eps per block, from the step before a logged one."""

    def __init__(self, monitor: Any):
        grads = monitor.probe("grad_norms").watch
        self.block_names = monitor.block_names
        self._owner = {id(p): o for (_, p), o in zip(grads.params, grads.owner) if o >= 0}
        # a copy of the block weights per measured step: on the attention steps only (attention_every),
        # or on every logged step when attention is never sampled
        self.every_logged = not monitor.attention_every
        self.armed = True
        self.optimizer = None
        self._handles: list = []
        self._params: list[torch.Tensor] = []  # the optimizer's parameters inside a block
        self._index: torch.Tensor | None = None  # [P] the block of each
        self._before: list[torch.Tensor] | None = None
        self._out: torch.Tensor | None = None  # [L, 2] from the last armed step
        self._adam_index: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def _attach(self, optimizer: Any) -> None:
        optimizer = _torch_optimizer(optimizer)
        if optimizer is None or optimizer is self.optimizer:
            return
        self.remove()
        self.optimizer = optimizer
        # FSDP2's DTensor parameters are sharded: their norms would need a sum across ranks, not done yet
        self._params = [p for g in optimizer.param_groups for p in g["params"]
                        if id(p) in self._owner and type(p) in (torch.Tensor, torch.nn.Parameter)]
        if not self._params:
            return
        self._index = torch.tensor([self._owner[id(p)] for p in self._params], device=self._params[0].device)
        self._handles = [optimizer.register_step_pre_hook(self._pre),
                         optimizer.register_step_post_hook(self._post)]

    def _pre(self, optimizer, args, kwargs) -> None:
        if self.armed:
            self._before = torch._foreach_mul(self._params, 1.0)  # a copy, one foreach kernel

    def _post(self, optimizer, args, kwargs) -> None:
        if self._before is None:
            return
        with torch.no_grad():
            torch._foreach_sub_(self._before, self._params)  # now the update (with its sign flipped)
            dev = self._params[0].device
            delta = torch.stack([n.to(dev, torch.float64) for n in torch._foreach_norm(self._before)])  # [P]
            weight = torch.stack([n.to(dev, torch.float64) for n in torch._foreach_norm(self._params)])  # [P]
            L = len(self.block_names)
            dsq = torch.zeros(L, dtype=torch.float64, device=dev).index_add_(0, self._index, delta * delta)
            wsq = torch.zeros(L, dtype=torch.float64, device=dev).index_add_(0, self._index, weight * weight)
            ratio = dsq.sqrt() / wsq.sqrt()  # [L]; a block without weights gives NaN -> null
            self._out = torch.stack([ratio, self._adam(optimizer, dev, L)], dim=1)  # [L, 2]
        self._before = None

    def _adam(self, optimizer: Any, dev: torch.device, L: int) -> torch.Tensor:
        """[L] sqrt(mean v_hat) / eps per block; NaN where the optimizer keeps no exp_avg_sq.
        Nothing is copied from the host (a CPU-to-GPU copy would wait for the GPU): the per-parameter
        divisors are Python floats (or device tensors for a capturable step count), and the block
        index tensor is built once per set of parameters."""
        vs, dens, idx = [], [], []
        for g in optimizer.param_groups:
            beta2, e = g.get("betas", (None, None))[1], g.get("eps")
            if beta2 is None or not e:
                continue
            for p in g["params"]:
                st = optimizer.state.get(p, {})
                v = st.get("exp_avg_sq")
                if id(p) not in self._owner or type(v) is not torch.Tensor or v.is_sparse:
                    continue
                vs.append(v)
                dens.append(v.numel() * _bias_correction(st, beta2) * e * e)  # mean(v_hat) / eps^2 divides by this
                idx.append(self._owner[id(p)])
        out = torch.full((L,), math.nan, dtype=torch.float64, device=dev)
        if not vs:
            return out
        key = tuple(idx)
        if key not in self._adam_index:
            ix = torch.tensor(idx, device=dev)
            has = torch.zeros(L, dtype=torch.bool, device=dev).index_fill_(0, ix, True)
            self._adam_index = {key: (ix, has)}  # one set at a time
        ix, has = self._adam_index[key]
        sums = [s.to(dev, torch.float64) for s in torch._foreach_norm(vs, 1)]  # sum(v) per parameter, v >= 0
        num = torch.zeros(L, dtype=torch.float64, device=dev).index_add_(0, ix, torch.stack(sums))
        cnt = torch.zeros(L, dtype=torch.float64, device=dev).index_add_(
            0, ix, torch.stack([torch.ones_like(s) * d for s, d in zip(sums, dens)]))  # [P] the divisors
        return torch.where(has, (num / cnt).sqrt(), out)

    def arm(self, step: int, logged: bool, sampled: bool) -> None:
        self.armed = sampled or (logged and self.every_logged)

    def discard(self) -> None:
        self._out = None

    def collect(self, inputs: StepInputs) -> torch.Tensor | None:
        if inputs.optimizer is not None:
            self._attach(inputs.optimizer)
        out, self._out = self._out, None
        return out

    def write(self, record: dict[str, Any], units: list[dict[str, list[float]]]) -> None:
        for name, unit in zip(self.block_names, units):
            for row in OPTIMIZER.rows:
                v = unit[row][0]
                record["layers"][name][row] = v if math.isfinite(v) else None

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles, self.optimizer, self._before = [], None, None


# the parameters are the same on every rank (DDP): not reduced again
OPTIMIZER = Measurement("optimizer", ("update_ratio", "adam_rms_v_eps"), "layer",
                        ("layers.*.update_ratio", "layers.*.adam_rms_v_eps"), OptimizerProbe, across_ranks=False,
                        fields=(_f("update_ratio", "update ratio", per="layer"),
                                _f("adam_rms_v_eps", "adam rms(v)/eps", per="layer")))
