"""The exact sweep on several checkpoints of one run: each head's verdict and effect at each, and what changed.

Built from the `HeadsResult` of each checkpoint (the same sweep `diagnose heads` runs, on the same data), so
nothing here measures: it lines the results up and names the heads whose verdict changed between two
consecutive checkpoints, with both intervals (a fine-tuning regression: which heads stopped mattering).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import ConfigError
from .result import HeadsResult, _finite, write_json_atomic

SCHEMA = "diagnose.heads-over-checkpoints/1"
MATTERS = "matters"
# the architecture two checkpoints must share for their heads to be the same heads
SAME = ("family", "n_layers", "n_heads")


@dataclass
class HeadCell:
    """One head at one checkpoint: its verdict and its effect with 95 % intervals (None: not verified)."""

    verdict: str | None
    delta_loss: float | None
    delta_loss_ci: list[float] | None
    delta_accuracy: float | None
    delta_accuracy_ci: list[float] | None
    p_value_loss_adjusted: float | None


@dataclass
class HeadChange:
    """A head whose verdict differs between checkpoint `index - 1` and `index`."""

    layer: int
    head: int
    index: int  # the later checkpoint's position in `checkpoints`
    kind: str  # "stopped mattering", "became vital" or "verdict changed"
    before: HeadCell
    after: HeadCell


@dataclass
class CheckpointsResult:
    """Heads x checkpoints: `cells[(layer, head)][i]` is the head at `checkpoints[i]`; `changes` in order."""

    checkpoints: list[str]
    model: dict[str, Any]
    task: str
    method: str
    n_examples: int
    baselines: list[dict[str, float]]  # accuracy, loss per checkpoint
    cells: dict[tuple[int, int], list[HeadCell]]
    changes: list[HeadChange] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        heads = [{"layer": layer, "head": head, "cells": [vars(c) for c in cells]}
                 for (layer, head), cells in sorted(self.cells.items())]
        changes = [{"layer": c.layer, "head": c.head, "index": c.index, "kind": c.kind,
                    "from_checkpoint": self.checkpoints[c.index - 1], "to_checkpoint": self.checkpoints[c.index],
                    "before": vars(c.before), "after": vars(c.after)} for c in self.changes]
        return _finite({"schema": SCHEMA, "checkpoints": self.checkpoints, "model": self.model, "task": self.task,
                        "method": self.method, "n_examples": self.n_examples, "baselines": self.baselines,
                        "heads": heads, "changes": changes})

    def save(self, path: str | Path) -> Path:
        """Write the JSON atomically (nothing half-written)."""
        return write_json_atomic(self.to_json(), path)


def _cell(h) -> HeadCell:
    return HeadCell(h.verdict, h.delta_loss, h.delta_loss_ci, h.delta_accuracy, h.delta_accuracy_ci,
                    h.p_value_loss_adjusted)


def check_same_model(results: Sequence[HeadsResult], names: Sequence[str]) -> None:
    """ConfigError naming the first checkpoint whose architecture differs from the first one's."""
    first = {k: results[0].model.get(k) for k in SAME}
    for name, r in zip(names[1:], results[1:]):
        other = {k: r.model.get(k) for k in SAME}
        if other != first:
            raise ConfigError(f"{name}: its model ({_arch(other)}) is not that of {names[0]} ({_arch(first)}); "
                              "name checkpoints of one run, whose heads are the same heads")


def _arch(model: dict) -> str:
    return f"{model['family']}, {model['n_layers']} layers, {model['n_heads']} heads"


def _kind(before: str | None, after: str | None) -> str:
    if before == MATTERS:
        return "stopped mattering"
    return "became vital" if after == MATTERS else "verdict changed"


def compare_checkpoints(results: Sequence[HeadsResult], names: Sequence[str]) -> CheckpointsResult:
    """Line up the sweeps of `names` (one HeadsResult each, in training order) and name what changed."""
    if len(results) != len(names) or len(results) < 2:
        raise ConfigError(f"compare at least two checkpoints, one result each (got {len(names)} names, "
                          f"{len(results)} results)")
    check_same_model(results, names)
    cells: dict[tuple[int, int], list[HeadCell]] = {}
    for r in results:
        for h in r.heads:
            cells.setdefault((h.layer, h.head), []).append(_cell(h))
    changes = [HeadChange(layer, head, i, _kind(row[i - 1].verdict, row[i].verdict), row[i - 1], row[i])
               for i in range(1, len(results)) for (layer, head), row in sorted(cells.items())
               if row[i - 1].verdict != row[i].verdict]
    first = results[0]
    return CheckpointsResult(checkpoints=list(names), model={k: first.model.get(k) for k in SAME}, task=first.task,
                             method=first.method, n_examples=first.n_examples,
                             baselines=[dict(r.baseline) for r in results], cells=cells, changes=changes)
