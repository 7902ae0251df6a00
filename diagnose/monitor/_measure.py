"""What a logged step measures, declared: one `Measurement` entry per signal, in a registry.

A measurement names its rows (the numbers it takes per unit), what a unit is (`per`: the model,
a block, an attention site with one number per head, or the parameters), how ranks combine each
row (`reduce`: the mean unless a row is named with max, min or sum), whether it is reduced across
ranks at all (`across_ranks=False`: already global, as gradients are after DDP's all-reduce), and
the record keys it writes, and what each key is (`fields`: a `diagnose.schema.Field` per key, with
its label, format, unit and `per` = model, layer, head or site; derived from `keys` when not
given). Its `probe` builds, from the monitor, the object that measures it on
the device (the `Probe` protocol below).

Adding a signal is one entry: a Measurement and its Probe in a new file, passed to
`register_measurement` (a `Registry`, diagnose/registry.py). `StepLayout` packs it with the others into the
step's one vector, and the monitor arms, collects, reduces and records it without knowing what it is. The
readers (read_run, `diagnose stats` and its --json and --tensorboard, the report, the live sinks) walk
the declared fields (_fields.record_fields) and show, besides, any number a record carries that
nothing declares (an older run folder, a measurement registered only in the training process).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from ..errors import ConfigError
from ..registry import Registry
from ..schema import Field

if TYPE_CHECKING:
    import torch

PER = ("model", "layer", "head", "parameter")  # what one unit of a measurement is
REDUCE_RULES = ("mean", "max", "min", "sum")  # how ranks (and a probe's micro-batches) combine a row
FIELD_PER = ("model", "layer", "head", "site")  # where a record field sits: top level, layers.<block>,
# attention.<site> as a list with one number per head, attention.<site> as one number
RECORD_PLACES = frozenset({"cli", "table", "report", "tensorboard", "sink"})  # a record field's default


@dataclass(frozen=True, eq=False)
class Measurement:
    """One measured signal. name: unique; rows: the numbers per unit, in packing order;
    per: what a unit is (PER); keys: the record keys it writes (documentation and tests);
    probe: probe(monitor) -> Probe; reduce: {row: rule} for rows not averaged across ranks;
    across_ranks: False for values that are already global on every rank; fields: what each key
    is (a Field per key; by default one per key of `keys`, labelled by its name)."""

    name: str
    rows: tuple[str, ...]
    per: str
    keys: tuple[str, ...]
    probe: Callable[[Any], "Probe"]
    reduce: Mapping[str, str] = field(default_factory=dict)
    across_ranks: bool = True
    fields: tuple[Field, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields) or tuple(key_field(k) for k in self.keys))
        for f in self.fields:
            if not isinstance(f, Field) or f.per not in FIELD_PER:
                raise ConfigError(f"measurement {self.name!r}: each field is a diagnose.schema.Field with per one "
                                  f"of {FIELD_PER}, got {f!r}")
        if not self.rows or len(set(self.rows)) != len(self.rows):
            raise ConfigError(f"measurement {self.name!r}: rows must be distinct names, got {self.rows}")
        if self.per not in PER:
            raise ConfigError(f"measurement {self.name!r}: per must be one of {PER}, got {self.per!r}")
        for row, rule in self.reduce.items():
            if row not in self.rows or rule not in REDUCE_RULES:
                raise ConfigError(f"measurement {self.name!r}: reduce {row!r}: {rule!r} needs a row of "
                                  f"{self.rows} and a rule of {REDUCE_RULES}")

    def rule(self, row: str) -> str:
        """How ranks combine `row`."""
        return self.reduce.get(row, "mean")


def record_field(key: str, label: str = "", fmt: str = ".4g", unit: str = "", per: str = "model",
                 plot: bool = False) -> Field:
    """A step record's field, shown by every reader of a run (and drawn in the report when `plot`)."""
    return Field(key, label or key.replace("_", " "), fmt, unit, per, RECORD_PLACES | ({"plot"} if plot else set()))


def key_field(key: str) -> Field:
    """The field of a record key written as in `Measurement.keys`: `layers.*.k` (per block),
    `attention.*.k` (per head: a list at each site) or a top-level `k` (the model)."""
    head, _, tail = key.partition(".*.")
    per = {"layers": "layer", "attention": "head"}.get(head) if tail else None
    return record_field(tail, per=per) if per else record_field(key)


@dataclass(frozen=True)
class StepInputs:
    """What step() was given, for the probes' collect(). snapshot: gradient norms an integration
    read early (TrainingMonitor._capture_grads), already unscaled; world: the number of ranks."""

    step: int
    loss: Any
    optimizer: Any
    scaler: Any
    snapshot: tuple | None
    world: int


class Probe(Protocol):
    """Measures one Measurement. Hooks it registers are removed in remove() (the monitor calls it
    from close(), in a `finally`)."""

    measurement: Measurement

    def arm(self, step: int, logged: bool, sampled: bool) -> None:
        """Before the forward of `step`: logged (step % every == 0), sampled (an attention step)."""

    def discard(self) -> None:
        """Drop what an unlogged step left."""

    def collect(self, inputs: StepInputs) -> "torch.Tensor | list[torch.Tensor | None] | None":
        """This logged step's values on the device, no host sync: a [units, rows] tensor (one number
        per row and unit), or per unit a [rows, width] tensor (None: the unit did not run), or None."""

    def write(self, record: dict[str, Any], units: list[dict[str, list[float]]]) -> None:
        """Put the host values (per unit that ran, {row: [width numbers]}) into the step record."""

    def remove(self) -> None:
        """Remove every hook."""


def _builtins() -> tuple[Measurement, ...]:
    from ._builtins import BUILTIN_MEASUREMENTS

    return BUILTIN_MEASUREMENTS


# every measurement, in the order of the parts of a step's vector (the built-ins first: _builtins.py)
REGISTRY: Registry[Measurement] = Registry("measurement", builtins=_builtins)
MEASUREMENTS = REGISTRY  # the older name: iterating it gives the entries


def register_measurement(m: Measurement) -> Measurement:
    """Add a measurement to every monitor created after this; its name must be new."""
    return REGISTRY.register(m)


def unregister_measurement(name: str) -> None:
    """Remove a registered measurement (tests, and users who turn one off)."""
    REGISTRY.unregister(name, missing_ok=True)
