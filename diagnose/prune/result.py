"""What `prune_heads` returns: the pruned model and the figures (`diagnose.prune/1` JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.nn as nn

SCHEMA = "diagnose.prune/1"


@dataclass
class PruneResult:
    """The pruned module (`.model`) and everything measured on the way.

    curve: one point per removal (the first is the unpruned model): n_removed, fraction_removed,
    accuracy, loss on the choice data. order: the removed heads, first removed first.
    """

    model: nn.Module = field(repr=False)
    info: dict[str, Any]  # family, class, n_layers, n_heads (per layer, before), format
    task: str
    method: str
    budget: dict[str, Any]
    n_examples: int
    baseline: dict[str, float]
    curve: list[dict[str, Any]]
    order: list[dict[str, Any]]
    heads_left: list[int]
    stop: dict[str, Any]
    verify: dict[str, Any]
    data: dict[str, Any]  # accuracy/loss before and after on the choice data, with the paired noise
    eval: dict[str, Any] | None
    size: dict[str, Any]
    timing: dict[str, Any]
    notes: list[str]
    cut: Any = field(default=None, repr=False)  # the cut.Cut (shapes and attributes for saving)
    saved: dict[str, Any] | None = None

    @property
    def removed(self) -> list[tuple[int, int]]:
        return [(o["layer"], o["head"]) for o in self.order]

    @property
    def fraction_removed(self) -> float:
        return len(self.order) / max(sum(self.info["n_heads"]), 1)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "model": self.info, "task": self.task, "method": self.method,
                "budget": self.budget, "n_examples": self.n_examples, "baseline": self.baseline,
                "n_heads_total": sum(self.info["n_heads"]), "n_removed": len(self.order),
                "fraction_removed": self.fraction_removed, "curve": self.curve, "order": self.order,
                "heads_left": self.heads_left, "stop": self.stop, "verify": self.verify, "data": self.data,
                "eval": self.eval, "size": self.size, "timing": self.timing, "notes": self.notes,
                "saved": self.saved}

    def save(self, folder: str | Path, *, tokenizer: Any = None) -> Path:
        """Write the pruned model to `folder` (new or empty) in the form it came in (see save.py)."""
        from .save import save_pruned

        self.saved = save_pruned(self, Path(folder), tokenizer=tokenizer)
        return Path(folder)
