"""Closing several heads at once, through the same gate as the sweep.

A single-head sweep cannot tell an idle head from a backup: a head whose twin covers for it
costs nothing alone. Closing a group answers that: if closing {a, b} costs more than closing
a alone, b was backing a up.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

import torch

from .._distributed import pick, ranks
from ..adapters.base import AttentionSite
from ..errors import ConfigError
from ..modes import eval_mode
from ..objectives import TASKS, call_model, logits_of, score, targets_for
from ..sites import find_heads
from .batches import as_batches, batch_size_of
from .gate import METHODS, gated
from .sweep import Sweep


@dataclass
class GroupEffect:
    """Accuracy and mean loss per scored unit with `heads` closed, next to the clean model's."""

    heads: list[tuple[int, int]]  # (layer, head)
    method: str
    accuracy: float
    loss: float
    baseline_accuracy: float
    baseline_loss: float

    @property
    def delta_accuracy(self) -> float:
        return self.accuracy - self.baseline_accuracy

    @property
    def delta_loss(self) -> float:
        return self.loss - self.baseline_loss

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["heads"] = [list(h) for h in self.heads]
        out.update(delta_accuracy=self.delta_accuracy, delta_loss=self.delta_loss)
        return out


def ablate_together(model: torch.nn.Module, data: Any, heads: Iterable[tuple[int, int]], *,
                    task: str = "classification", method: str = "zero", batch_size: int | None = None,
                    sites: Sequence[AttentionSite] | None = None,
                    baseline: tuple[float, float] | None = None, distributed: bool | None = None) -> GroupEffect:
    """Close every (layer, head) in `heads` at once and score the model on `data`.

    data, task, method, batch_size and distributed as for ablate_heads; method "mean" replaces each
    closed head's output by its mean over the data set's real tokens. baseline: the clean (accuracy,
    loss) when already known (the sweep's), which saves the clean passes.
    """
    if task not in TASKS:
        raise ConfigError(f"task {task!r} is not one of {', '.join(TASKS)}")
    if method not in METHODS:
        raise ConfigError(f"method {method!r} is not one of {', '.join(METHODS)}")
    device = next((p.device for p in model.parameters()), None)
    batches = as_batches(data, batch_size, device)
    sites = list(sites) if sites is not None else find_heads(model, example=batches[0][0])
    closed = sorted({(int(layer), int(head)) for layer, head in heads})
    by_layer = {site.layer: site for site in sites}
    for layer, head in closed:
        if layer not in by_layer or not 0 <= head < by_layer[layer].n_heads:
            shape = ", ".join(f"layer {s.layer}: {s.n_heads} heads" for s in sites)
            raise ConfigError(f"there is no head {head} in layer {layer} ({shape})")

    r = ranks(distributed)
    mine = pick(batches, r)

    def work() -> list[float]:
        with eval_mode(model), gated(sites) as gates, torch.no_grad():
            if method == "mean":
                reduce = (lambda sums, counts: r.add_up(sums, counts, device)) if r.active else None
                for gate, fill in zip(gates, Sweep(model, sites, gates, task, reuse=False).mean_outputs(mine,
                                                                                                      reduce=reduce)):
                    gate.fill = fill
            return _closed_sums(model, mine, task, closed, gates, device, clean=not baseline)

    # [clean loss_sum, clean correct, closed loss_sum, closed correct, units], added up over the ranks
    _, (clean_loss_sum, clean_correct, loss_sum, correct, units) = r.add_up([], r.together("closing heads", work))
    n = max(units, 1.0)
    clean_acc, clean_loss = baseline if baseline else (clean_correct / n, clean_loss_sum / n)
    return GroupEffect(closed, method, correct / n, loss_sum / n, clean_acc, clean_loss)


def _closed_sums(model: torch.nn.Module, batches: Sequence, task: str, closed: list[tuple[int, int]], gates: list,
                 device: torch.device | None, *, clean: bool) -> list[float]:
    """[clean loss_sum, clean correct, closed loss_sum, closed correct, units] over batches (the clean
    sums stay 0 unless clean)."""
    sums = {"clean": [0.0, 0.0], "closed": [0.0, 0.0]}  # [loss_sum, correct]
    units = 0.0
    for inputs, labels in batches:
        targets = targets_for(task, inputs, labels)
        B = batch_size_of(inputs)
        for key, shut in (("clean", []), ("closed", closed))[0 if clean else 1:]:
            for gate in gates:
                scale = torch.ones(B, gate.site.n_heads, device=targets.device)  # [B, H]
                for layer, head in shut:
                    if layer == gate.site.layer:
                        scale[:, head] = 0.0
                gate.scale = scale
            sc = score(logits_of(call_model(model, inputs)), targets.to(device) if device else targets)
            sums[key][0] += float(sc.loss_sum.sum())
            sums[key][1] += float(sc.correct.sum())
        units += float(sc.count.sum())
    return [*sums["clean"], *sums["closed"], units]
