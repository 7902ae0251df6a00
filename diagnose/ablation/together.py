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
from ..sites import find_heads
from .batches import as_batches, for_last_position
from .config import TOGETHER, AblationConfig
from .gate import gated
from .methods import DataPass, get_method, prepare
from .scored import ScoredOnly, output_layer
from .steps import first_example, indexed
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
                    config: AblationConfig | None = None, sites: Sequence[AttentionSite] | None = None,
                    baseline: tuple[float, float] | None = None, **options: Any) -> GroupEffect:
    """Close every (layer, head) in `heads` at once and score the model on `data`.

    config: an AblationConfig, of which this reads task, method, batch_size, draws, seed and
    distributed (as for ablate_heads); those six are also keywords (task="lm"), laid over `config`.
    Method "mean" replaces each closed head's output by its mean over the data set's real tokens.
    baseline: the clean (accuracy, loss) when already known (the sweep's), which saves the clean passes.
    """
    cfg = AblationConfig.of(config, options, caller="ablate_together", options=TOGETHER)
    how, draws, seed = get_method(cfg.method), cfg.draws, cfg.seed
    device = next((p.device for p in model.parameters()), None)
    batches = for_last_position(model, as_batches(data, cfg.batch_size, device), cfg.task)
    sites = list(sites) if sites is not None else find_heads(model, example=batches[0][0])
    closed = sorted({(int(layer), int(head)) for layer, head in heads})
    by_layer = {site.layer: site for site in sites}
    for layer, head in closed:
        if layer not in by_layer or not 0 <= head < by_layer[layer].n_heads:
            shape = ", ".join(f"layer {s.layer}: {s.n_heads} heads" for s in sites)
            raise ConfigError(f"there is no head {head} in layer {layer} ({shape})")
    base = [(s, head) for s, site in enumerate(sites) for layer, head in closed if site.layer == layer]

    r = ranks(cfg.distributed)
    mine = pick(batches, r)

    def work() -> list[float]:
        with eval_mode(model), gated(sites) as gates:
            # logits at the scored positions only, as the sweep makes them (an LM's vocabulary at every
            # position cost SmolLM2 a quarter more per forward)
            shut = Sweep(model, sites, gates, cfg.task, reuse=False, closed=base,
                         scored=ScoredOnly(output_layer(model, sites)))
            reduce = (lambda sums, counts: r.add_up(sums, counts, device)) if r.active else None
            first = first_example(batches, r)
            prepare(how, DataPass(shut, mine, reduce, first=first, draws=draws, seed=seed))
            return _sums(shut, mine, first, clean=not baseline)

    # [clean loss_sum, clean correct, closed loss_sum, closed correct, units], added up over the ranks
    _, (clean_loss_sum, clean_correct, loss_sum, correct, units) = r.add_up([], r.run_local("closing heads", work))
    n = max(units, 1.0)
    clean_acc, clean_loss = baseline if baseline else (clean_correct / n, clean_loss_sum / n)
    return GroupEffect(closed, cfg.method, correct / n, loss_sum / n, clean_acc, clean_loss)


def _sums(shut: Sweep, batches: Sequence, first: int, *, clean: bool) -> list[float]:
    """[clean loss_sum, clean correct, closed loss_sum, closed correct, units] over batches, each a clean
    pass of the sweep without and with its base heads closed (the clean sums stay 0 unless clean)."""
    opened = Sweep(shut.model, shut.sites, shut.gates, shut.task, reuse=False, scored=shut.scored)
    sums = [0.0] * 5
    for inputs, labels, rows in indexed(batches, first):
        for offset, sweep in ((0, opened), (2, shut))[0 if clean else 1:]:
            for draw in range(sweep.draws):  # a random fill's draws, averaged
                sweep.draw = draw
                c = sweep.clean(inputs, labels, grad=False, record=False, rows=rows)
                sums[offset] += float(c.loss_sum.sum()) / sweep.draws
                sums[offset + 1] += float(c.correct.sum()) / sweep.draws
            sweep.draw = 0
        sums[4] += float(c.count.sum())
    return sums
