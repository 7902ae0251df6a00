"""The layout of a logged step's flat vector: what stands where, named once.

A logged step brings everything to the host in ONE `.tolist()`, so the measurements' values
travel packed in one float64 vector: first the parts reduced across ranks, then the parts that
are already global (gradient norms), each part in registry order (`_measure.MEASUREMENTS`).
A part holds its measurement's units one after the other, each unit row-major ([rows, width]).
`StepLayout` is built from the parts' shapes and is the only code that knows the offsets: it
packs, reduces across ranks by each row's rule and unpacks, so that adding a measurement adds a
part and nothing reads a shifted number.

Activation statistics travel with the variance replaced by the second moment E[x^2], so that
forwards (micro-batches) and ranks pool exactly by averaging; `max_abs` pools by the maximum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .._activations import STAT_NAMES
from ..errors import DataError
from ._measure import Measurement

ATTENTION_ROWS = ("entropy", "max_weight", "uniform_entropy")  # AttentionWatch's [3, H] rows
ACTIVATION_REDUCE = {"max_abs": "max"}  # statistics pooled by the maximum (the others by the mean)
_RECORD_KEY = {"token_cos": "token_cos"}  # step-record key of a statistic, default act_<name>
_COMBINE = {"max": "amax", "min": "amin", "sum": "sum"}  # rule -> the tensor reduction over ranks


def record_key(stat: str) -> str:
    """The key of an activation statistic in a step record's layers entry (`var` -> `act_var`)."""
    return _RECORD_KEY.get(stat, f"act_{stat}")


def to_pooled(stats: torch.Tensor, names: tuple[str, ...] = STAT_NAMES) -> torch.Tensor:
    """[..., S] statistics (float64) with the variance replaced by the second moment."""
    mean, var = names.index("mean"), names.index("var")
    out = stats.clone()
    out[..., var] = stats[..., var] + stats[..., mean] ** 2
    return out


def pool(rows: torch.Tensor, names: tuple[str, ...] = STAT_NAMES) -> torch.Tensor:
    """[n, S] pooled rows (to_pooled's form) of n equal-size forwards or ranks -> [S]: the mean,
    the maximum for the max-pooled statistics."""
    out = rows.mean(0)
    for j, name in enumerate(names):
        if ACTIVATION_REDUCE.get(name) == "max":
            out[j] = rows[:, j].amax()
    return out


def _units(m: Measurement, value: Any) -> tuple[list[torch.Tensor], tuple[int, ...]]:
    """(the unit tensors, flattened, and each unit's width) of one probe's collected value."""
    n = len(m.rows)
    if value is None:
        return [], ()
    if isinstance(value, torch.Tensor):  # [units, rows]: one number per row and unit
        if value.dim() != 2 or value.shape[1] != n:
            raise DataError(f"{m.name} statistics {tuple(value.shape)} do not match its rows {m.rows}")
        return ([value.flatten()] if value.shape[0] else []), (1,) * value.shape[0]
    units = [t for t in value if t is not None]
    for t in units:  # per unit [rows, width]
        if t.dim() != 2 or t.shape[0] != n:
            raise DataError(f"{m.name} statistics {tuple(t.shape)} do not match its rows {m.rows}")
    return [t.flatten() for t in units], tuple(t.shape[1] for t in units)


@dataclass(frozen=True)
class Part:
    """One measurement's place in the vector: its units' widths (1 per block, H per attention site)."""

    measurement: Measurement
    widths: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.measurement.rows) * sum(self.widths)


@dataclass(frozen=True)
class StepLayout:
    """Offsets of one logged step's vector: the parts reduced across ranks, then the others."""

    parts: tuple[Part, ...]

    @classmethod
    def of(cls, measured: Sequence[tuple[Measurement, Any]]) -> "StepLayout":
        """The layout of these (measurement, collected value) pairs, in vector order."""
        return cls(tuple(Part(m, _units(m, v)[1]) for m, v in _ordered(measured)))

    @property
    def shared(self) -> int:
        """Length of the leading part reduced across ranks."""
        return sum(p.size for p in self.parts if p.measurement.across_ranks)

    def pack(self, measured: Sequence[tuple[Measurement, Any]], device: torch.device) -> torch.Tensor:
        """One float64 vector of every collected value, in layout order, on `device`."""
        flat = [t.to(device, torch.float64) for m, v in _ordered(measured) for t in _units(m, v)[0]]
        v = torch.cat(flat) if flat else torch.zeros(0, dtype=torch.float64, device=device)
        assert v.numel() == sum(p.size for p in self.parts), (v.numel(), self)
        return v

    def reduce_ranks(self, gathered: torch.Tensor) -> torch.Tensor:
        """[world, shared] of every rank -> [shared]: each row by its rule (the mean by default)."""
        out = gathered.mean(0)
        for rule, idx in self._rule_indices().items():
            ix = torch.tensor(idx, device=gathered.device)
            out[ix] = getattr(gathered[:, ix], _COMBINE[rule])(0)
        return out

    def _rule_indices(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        pos = 0
        for part in self.parts:
            m = part.measurement
            if not m.across_ranks:
                break
            for w in part.widths:
                for r, row in enumerate(m.rows):
                    if m.rule(row) != "mean":
                        out.setdefault(m.rule(row), []).extend(range(pos + r * w, pos + (r + 1) * w))
                pos += len(m.rows) * w
        return out

    def unpack(self, values: list[Any]) -> dict[str, list[dict[str, list[Any]]]]:
        """{measurement name: per unit {row: [width values]}} from the host list."""
        out: dict[str, list[dict[str, list[Any]]]] = {}
        pos = 0
        for part in self.parts:
            units = []
            for w in part.widths:
                units.append({row: values[pos + r * w:pos + (r + 1) * w]
                              for r, row in enumerate(part.measurement.rows)})
                pos += len(part.measurement.rows) * w
            out[part.measurement.name] = units
        return out


def _ordered(measured: Sequence[tuple[Measurement, Any]]) -> list[tuple[Measurement, Any]]:
    """The parts reduced across ranks first, each group in the given (registry) order."""
    return ([(m, v) for m, v in measured if m.across_ranks]
            + [(m, v) for m, v in measured if not m.across_ranks])
