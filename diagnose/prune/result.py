"""What `prune_heads` returns: the pruned model and the figures, in typed parts (`diagnose.prune/1` JSON).

Each part is a dataclass whose one `to_json()` (`_Part`'s) writes the object the schema has always had,
in the same key order, so the JSON (and the report that reads it, reports/view_prune.py) is unchanged.
`.save(path)` writes that JSON, as on every result; `.save_pretrained(folder)` writes the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Mapping

import torch.nn as nn

from .._write import atomic_write
from .._json import dumps

SCHEMA = "diagnose.prune/1"


class _Part:
    """A part of the prune JSON: its fields in declaration order (`first` ones before), a nested part
    written by its own to_json; `keys` renames a field in the JSON, `optional` fields are left out when None."""

    first: ClassVar[tuple[str, ...]] = ()
    keys: ClassVar[Mapping[str, str]] = {}
    optional: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> dict[str, Any]:
        names = [*self.first, *(f.name for f in fields(self) if f.name not in self.first)]  # type: ignore[arg-type]
        values = {name: getattr(self, name) for name in names}
        return {self.keys.get(k, k): (v.to_json() if isinstance(v, _Part) else v)
                for k, v in values.items() if not (v is None and k in self.optional)}


@dataclass(frozen=True)
class Figures(_Part):
    """Accuracy (a fraction) and mean loss per scored unit on some data."""

    accuracy: float
    loss: float


@dataclass(frozen=True)
class ModelInfo(_Part):
    """The model pruned (JSON "model"): heads per layer before pruning, and the format it was read in."""

    family: str
    class_name: str
    n_layers: int
    n_heads: list[int]
    format: str | None
    keys: ClassVar[Mapping[str, str]] = {"class_name": "class"}


@dataclass(frozen=True)
class Settings(_Part):
    """What the call asked for (JSON "budget"): the budget, candidates per round, removal limit."""

    max_drop: float | None
    max_loss: float | None
    candidates: int
    limit: int | None


@dataclass(frozen=True)
class CurvePoint(_Part):
    """The model after n_removed removals on the choice data; layer/head: the head the step removed
    (None on the first point, the unpruned model, which the JSON writes without them)."""

    n_removed: int
    fraction_removed: float
    accuracy: float
    loss: float
    layer: int | None = None
    head: int | None = None
    optional: ClassVar[tuple[str, ...]] = ("layer", "head")


@dataclass(frozen=True)
class Removal(_Part):
    """One removed head, in the order removed: its estimated cost and the exact figures after it."""

    layer: int
    head: int
    estimate: float
    accuracy: float
    loss: float


@dataclass(frozen=True)
class Candidate(_Part):
    """The head the budget refused: the figures removing it would have given."""

    layer: int
    head: int
    accuracy: float
    loss: float


@dataclass(frozen=True)
class Stop(_Part):
    """Why the removals stopped; next: the refused head, when the budget stopped them."""

    reason: str
    next: Candidate | None = None

    @classmethod
    def from_choice(cls, stop: dict[str, Any]) -> "Stop":
        return cls(stop["reason"], Candidate(**stop["next"]) if stop.get("next") is not None else None)

    optional: ClassVar[tuple[str, ...]] = ("next",)


@dataclass(frozen=True)
class Verification(_Part):
    """The pruned model's outputs against the gated original's, judged by the tolerance policy."""

    max_abs_diff: float
    output_scale: float
    tolerance: float
    passed: bool


@dataclass(frozen=True)
class Change(_Part):
    """Before/after figures on some data, with the paired accuracy change and its 95 % interval.

    n_examples: written first (held-out data, JSON "eval"); note: written last (the choice data,
    JSON "data", whose figures flatter the pruned model); each left out of the JSON when None."""

    before: Figures
    after: Figures
    delta_accuracy: float
    delta_accuracy_ci95: list[float]
    noise: float
    n_examples: int | None = None
    note: str | None = None
    first: ClassVar[tuple[str, ...]] = ("n_examples",)
    optional: ClassVar[tuple[str, ...]] = ("n_examples", "note")


@dataclass(frozen=True)
class Size(_Part):
    """Parameters, and the median forward time of one batch, before and after."""

    parameters_before: int
    parameters_after: int
    forward_seconds_before: float
    forward_seconds_after: float
    speedup: float | None
    repeats: int
    threads: int
    batch: int


@dataclass(frozen=True)
class Timing(_Part):
    """The whole call: seconds, greedy rounds, forward passes through the gated model."""

    seconds: float
    rounds: int
    forward_passes: int


@dataclass(frozen=True)
class Saved(_Part):
    """Where save_pretrained wrote the model, in which form, and the files it wrote."""

    path: str
    form: str
    files: list[str]


@dataclass
class PruneResult:
    """The pruned module (`.model`) and everything measured on the way.

    curve: one point per removal (the first is the unpruned model). order: the removed heads,
    first removed first. data: before/after on the choice data; eval: on held-out data (or None).
    """

    model: nn.Module = field(repr=False)
    info: ModelInfo
    task: str
    method: str
    settings: Settings
    n_examples: int
    baseline: Figures
    curve: list[CurvePoint]
    order: list[Removal]
    heads_left: list[int]
    stop: Stop
    verify: Verification
    data: Change
    eval: Change | None
    size: Size
    timing: Timing
    notes: list[str]
    cut: Any = field(default=None, repr=False)  # the cut.Cut (shapes and attributes for saving)
    saved: Saved | None = None

    @property
    def removed(self) -> list[tuple[int, int]]:
        return [(o.layer, o.head) for o in self.order]

    @property
    def fraction_removed(self) -> float:
        return len(self.order) / max(sum(self.info.n_heads), 1)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "model": self.info.to_json(), "task": self.task, "method": self.method,
                "budget": self.settings.to_json(), "n_examples": self.n_examples, "baseline": self.baseline.to_json(),
                "n_heads_total": sum(self.info.n_heads), "n_removed": len(self.order),
                "fraction_removed": self.fraction_removed, "curve": [p.to_json() for p in self.curve],
                "order": [o.to_json() for o in self.order], "heads_left": self.heads_left,
                "stop": self.stop.to_json(), "verify": self.verify.to_json(), "data": self.data.to_json(),
                "eval": self.eval.to_json() if self.eval is not None else None, "size": self.size.to_json(),
                "timing": self.timing.to_json(), "notes": self.notes,
                "saved": self.saved.to_json() if self.saved is not None else None}

    def save(self, path: str | Path) -> Path:
        """Write the JSON atomically (strict JSON, one policy): what `.save` means on every result."""
        return atomic_write(path, dumps(self.to_json(), indent=1), what="prune JSON")

    def save_pretrained(self, folder: str | Path, *, tokenizer: Any = None) -> Path:
        """Write the pruned model to `folder` (new or empty) in the form it came in (see save.py), as
        Hugging Face's save_pretrained writes a model folder; `.saved` then says where and how."""
        from .save import save_pruned

        self.saved = Saved(**save_pruned(self, Path(folder), tokenizer=tokenizer))
        return Path(folder)
