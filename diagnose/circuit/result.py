"""The typed result of `find_circuit`: every verified edge with its evidence, the edge attribution's
ranking, and the minimal circuit; strict JSON (`diagnose.circuit/1`, written atomically) and a DataFrame."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _json
from .._write import atomic_write
from ..errors import ConfigError
from .evidence import EdgeEffect
from .minimal import Circuit

SCHEMA = "diagnose.circuit/1"
# the attention statistics that name a head of the circuit (diagnose/statistics.py), and how strong one must be
NAMING = ("prev_token", "duplicate_token", "induction")
NAMED_AT = 0.5


@dataclass
class CircuitResult:
    """What `find_circuit` measured (docs/circuits.md)."""

    model: dict[str, Any]
    task: str
    method: str
    n_examples: int
    n_units: int
    baseline: dict[str, float]
    band: dict[str, float]
    significance: dict[str, Any]
    n_edges: int
    edges: list[EdgeEffect]  # the verified ones, largest delta loss first
    circuit: Circuit
    attribution: dict[str, Any] | None = None
    heads: list[dict[str, Any]] = field(default_factory=list)  # the circuit's heads, named by their attention
    notes: list[str] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)

    def edge(self, label: str) -> EdgeEffect:
        """The verified edge called `label` ('L0.H0 -> L1.H0 (k)'); ConfigError when none is."""
        for e in self.edges:
            if e.edge.label == label:
                return e
        known = ", ".join(e.edge.label for e in self.edges[:5])
        raise ConfigError(f"no verified edge {label!r}; the verified edges are {known}{', ...' if len(self.edges) > 5 else ''}")

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "model": self.model, "task": self.task, "method": self.method,
                "n_examples": self.n_examples, "n_units": self.n_units, "baseline": self.baseline,
                "band": self.band, "significance": self.significance, "n_edges": self.n_edges,
                "edges": [e.to_json() for e in self.edges], "circuit": self.circuit.to_json(),
                "attribution": self.attribution, "heads": self.heads, "notes": self.notes, "timing": self.timing,
                "sections": [s.to_json() for s in self.sections()]}

    def sections(self) -> list:
        """The tables the CLI prints and the report draws (table.py)."""
        from .table import edge_section

        return [edge_section(self)]

    def to_frame(self):
        """One row per verified edge: its ends, composition, effects (each interval as `_low` / `_high`)."""
        import pandas as pd

        rows = []
        for e in self.edges:
            row = {k: v for k, v in e.to_json().items() if not isinstance(v, (list, dict))}
            row.update(sender_layer=e.edge.sender[0], sender_head=e.edge.sender[1],
                       receiver_layer=None if e.edge.receiver is None else e.edge.receiver[0],
                       receiver_head=None if e.edge.receiver is None else e.edge.receiver[1])
            for key in ("delta_loss_ci", "delta_accuracy_ci", "delta_logit_diff_ci"):
                ci = getattr(e, key) or [None, None]
                row[f"{key}_low"], row[f"{key}_high"] = ci
            rows.append(row)
        return pd.DataFrame(rows)

    def save(self, path: str | Path) -> Path:
        """Write the JSON atomically (a temporary file renamed over the target): nothing half-written."""
        return atomic_write(path, _json.dumps(self.to_json(), indent=1), what="circuit JSON")


def name_heads(circuit: Circuit, stats: list[dict[str, list]] | None) -> list[dict[str, Any]]:
    """Each head of the circuit (not its MLPs) with its NAMING statistics and the strongest of them at NAMED_AT
    or more."""
    ends = {e.sender for e in circuit.edges} | {e.receiver for e in circuit.edges if e.receiver}
    heads = sorted(n for n in ends if n[1] is not None)
    out = []
    for layer, head in heads:
        per = {k: None for k in NAMING}
        if stats is not None:
            for k in NAMING:
                values = stats[layer].get(k)
                per[k] = None if values is None or values[head] is None else float(values[head])
        known = {k: v for k, v in per.items() if v is not None and v == v}
        best = max(known, key=known.get, default=None)
        out.append({"layer": layer, "head": head, "stats": per,
                    "role": best if best is not None and known[best] >= NAMED_AT else None})
    return out
