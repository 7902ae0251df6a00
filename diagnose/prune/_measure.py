"""Scoring the model through the head gate with some heads closed: the exact measure and the
cheap estimate the choice loop uses. `closed` is one bool tensor per site, [H] (True = removed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from ..ablation.batches import batch_size_of
from ..ablation.gate import Gate
from ..objectives import call_model, logits_of, require_finite, score, targets_for

BUDGET = 2 ** 25  # float elements of logits one replicated forward may hold


@dataclass
class Measured:
    """Sums over the data with one set of heads closed."""

    loss_sum: float
    correct: float
    units: float

    @property
    def accuracy(self) -> float:
        return self.correct / max(self.units, 1.0)

    @property
    def loss(self) -> float:
        return self.loss_sum / max(self.units, 1.0)


class Measure:
    """Forwards through open gates; counts them. `per_example` holds the last exact pass's
    per-example correctness, for the paired noise of the curve."""

    def __init__(self, model: torch.nn.Module, gates: Sequence[Gate], task: str):
        self.model, self.gates, self.task = model, list(gates), task
        self.forwards = 0
        self.classes = 1024  # logits per scored position, learnt from the first forward (sizes the replicas)

    def exact(self, batches: Sequence[tuple[Any, Any]], closed: list[torch.Tensor],
              extra: Sequence[tuple[int, int]] = ((-1, -1),)) -> list[Measured]:
        """One Measured per entry of `extra`: `closed` plus that (site, head) closed too ((-1, -1): nothing
        more). The batch is replicated once per entry, several per forward."""
        sums = [[0.0, 0.0, 0.0] for _ in extra]
        with torch.no_grad():
            for inputs, labels in batches:
                B = batch_size_of(inputs)
                targets = targets_for(self.task, inputs, labels)
                per = max(1, BUDGET // max(1, B * self._width(inputs) * self.classes))
                for start in range(0, len(extra), per):
                    chunk = list(extra[start:start + per])
                    K = len(chunk)
                    self.close(closed, B, chunk, targets.device)
                    try:
                        logits = logits_of(call_model(self.model, _repeat(inputs, K)))
                    finally:
                        self.open_all()
                    self.forwards += 1
                    self.classes = int(logits.shape[-1])
                    require_finite(self.model, logits, "with heads closed")
                    sc = score(logits, _repeat(targets, K).to(logits.device))
                    for k in range(K):
                        rows = slice(k * B, (k + 1) * B)
                        sums[start + k][0] += float(sc.loss_sum[rows].sum())
                        sums[start + k][1] += float(sc.correct[rows].sum())
                        sums[start + k][2] += float(sc.count[rows].sum())
        return [Measured(*s) for s in sums]

    def per_example(self, batches: Sequence[tuple[Any, Any]], closed: list[torch.Tensor]) -> np.ndarray:
        """Per-example accuracy (correct / scored units) with `closed` shut.  # [N]"""
        out = []
        with torch.no_grad():
            for inputs, labels in batches:
                targets = targets_for(self.task, inputs, labels)
                self.close(closed, batch_size_of(inputs), [(-1, -1)], targets.device)
                try:
                    sc = score(logits_of(call_model(self.model, inputs)), targets)
                finally:
                    self.open_all()
                self.forwards += 1
                out.append((sc.correct / sc.count.clamp_min(1)).double().cpu().numpy())
        return np.concatenate(out)

    def estimate(self, batches: Sequence[tuple[Any, Any]], closed: list[torch.Tensor]) -> list[np.ndarray]:
        """Per site [H]: the change of the mean loss if each open head were closed too, to second order
        (-L' + L''/2, the curvature by the empirical Fisher: the same estimate as `ablate_heads --fast`)."""
        linear = [np.zeros(len(c)) for c in closed]
        fisher = [np.zeros(len(c)) for c in closed]
        units = 0.0
        for inputs, labels in batches:
            B = batch_size_of(inputs)
            targets = targets_for(self.task, inputs, labels)
            scales = [(~c).float().to(targets.device)[None].repeat(B, 1).requires_grad_(True) for c in closed]
            for gate, s in zip(self.gates, scales):
                gate.scale = s  # [B, H]
            try:
                with torch.enable_grad():
                    sc = score(logits_of(call_model(self.model, inputs)), targets)
                    grads = torch.autograd.grad(sc.loss_sum.sum(), scales, allow_unused=True)
            finally:
                self.open_all()
            self.forwards += 1
            count = sc.count.double().cpu().numpy()
            scored = count > 0
            units += float(count.sum())
            for s, g in enumerate(grads):
                if g is None:
                    continue
                g = g.double().cpu().numpy()  # [B, H]: d loss_sum[b] / d gate[b, h]
                linear[s] += g.sum(0)
                fisher[s] += (g[scored] ** 2 / count[scored, None]).sum(0)
        return [(-lin + 0.5 * fi) / max(units, 1.0) for lin, fi in zip(linear, fisher)]

    def close(self, closed: list[torch.Tensor], B: int, extra: list[tuple[int, int]], device) -> None:
        """Set every gate for len(extra) replicas of a batch of B: `closed` shut in all, extra[k] too in replica k."""
        for s, gate in enumerate(self.gates):
            scale = (~closed[s]).float().to(device)[None, None].repeat(len(extra), B, 1)  # [K, B, H]
            for k, (site, head) in enumerate(extra):
                if site == s:
                    scale[k, :, head] = 0.0
            gate.scale = scale.reshape(len(extra) * B, -1)

    def open_all(self) -> None:
        """Every gate back to open (scale None)."""
        for gate in self.gates:
            gate.scale = None

    @staticmethod
    def _width(inputs: Any) -> int:
        ids = inputs["input_ids"] if isinstance(inputs, Mapping) else inputs
        return int(ids[0].numel()) if isinstance(ids, torch.Tensor) and ids.dim() > 0 else 1


def _repeat(obj: Any, K: int) -> Any:
    """The batch K times along dim 0 (replica-major, as the gate's scale rows)."""
    if K == 1 or obj is None:
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.repeat(K, *([1] * (obj.dim() - 1))) if obj.dim() > 0 else obj
    if isinstance(obj, Mapping):
        return {k: _repeat(v, K) for k, v in obj.items()}
    return obj
