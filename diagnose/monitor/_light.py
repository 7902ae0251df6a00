"""The light step: what TrainingMonitor.step() measures between logged steps.

Only the alerts' inputs that can spike from one step to the next: the loss, the lr and the global
gradient norm (pre-clip, AMP-unscaled), with the first parameter whose gradient is not finite. No
hook runs on such a step's forward; the per-parameter norms are one `_foreach_norm` on the device
and the step's two numbers reach the host in one `.tolist()`. So a spike between logged steps is
still judged by the every-step detectors (loss_spike, grad_spike, nonfinite), its batch saved and
its update skipped, and the per-layer and attention statistics, the costly part, are logged on
every `every`-th step only.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from ._probes import _gather_shards
from ._signals import scaler_divisor


def step_lr(lr: Any, optimizer: Any) -> Any:
    """The lr given to step(), else the optimizer's first group's; a tensor lr costs its own sync."""
    if lr is None and optimizer is not None and getattr(optimizer, "param_groups", None):
        lr = optimizer.param_groups[0].get("lr")
    return float(lr) if isinstance(lr, torch.Tensor) else lr


def light_record(monitor: Any, s: int, loss: Any, optimizer: Any, lr: Any, scaler: Any) -> dict[str, Any]:
    """{step, loss, lr, grad_norm[, nonfinite_param]} of a step that is not logged."""
    snapshot = monitor._grad_snapshot
    norms, idx, sharded = snapshot if snapshot is not None else monitor._grads.norms()  # [P] on the device
    if isinstance(loss, torch.Tensor):
        dev = loss.device
        loss_t = loss.detach().reshape(-1)[:1].double()  # [1]
    else:
        dev = norms.device if norms is not None else torch.device("cpu")
        loss_t = torch.tensor([math.nan if loss is None else float(loss)], dtype=torch.float64, device=dev)
    if monitor.world > 1:
        dist.all_reduce(loss_t)  # the ranks' mean loss, as a logged step's: every rank then acts alike
        loss_t = loss_t / monitor.world
    gn_t = torch.full((1,), math.nan, dtype=torch.float64, device=dev)
    if norms is not None:
        if any(sharded) and monitor.world > 1:
            norms = _gather_shards(norms, sharded)
        div = scaler_divisor(scaler, optimizer) if snapshot is None else None  # a snapshot is unscaled
        if div is not None:
            norms = norms / div.to(norms.device)
        gn_t = norms.square().sum().sqrt().reshape(1).to(dev)
    loss_v, gn = torch.cat([loss_t, gn_t]).tolist()  # this step's one host sync
    rec: dict[str, Any] = {"step": s, "loss": None if loss is None else loss_v, "lr": step_lr(lr, optimizer),
                           "grad_norm": gn if norms is not None else None}
    if norms is not None and not math.isfinite(gn):
        bad = [i for i, n in zip(idx, norms.tolist()) if not math.isfinite(n)]  # rare: a NaN step
        if bad:
            rec["nonfinite_param"] = monitor._grads.params[bad[0]][0]
    return rec
