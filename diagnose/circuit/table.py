"""The circuit's edge table, declared once (schema.Field columns): the CLI prints it, the JSON carries it
under `sections`, and the report draws it, all from the same Section."""

from __future__ import annotations

from typing import Any

from ..schema import Field, Section

EDGE_COLUMNS = (
    Field("label", "edge", "s"),
    Field("composition", "via", "s"),
    Field("verdict", "verdict", "s"),
    Field("delta_loss", "Δloss", "+.4f", "nats"),
    Field("delta_loss_ci", "Δloss, 95 % CI", "s", "nats"),
    Field("delta_accuracy", "Δaccuracy", "+.2%"),
    Field("p_value_loss_adjusted", "p (corrected)", ".2g"),
    Field("estimate", "estimated Δloss", "+.4f", "nats"),
    Field("in_circuit", "in circuit", "s"),
    Field("inclusion", "kept in resamples", ".0%"),
    Field("self_repair_gap", "self-repair gap", "+.4f", "nats"),
)
SHOWN = 30  # rows of the edge table: the circuit's edges, then the largest others


def _interval(ci: list[float] | None) -> str | None:
    return None if ci is None else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def edge_section(result: Any) -> Section:
    """The verified edges, the circuit's first, then by delta loss, at most SHOWN rows."""
    keys = {c.key for c in EDGE_COLUMNS}
    ordered = [e for e in result.edges if e.in_circuit] + [e for e in result.edges if not e.in_circuit]
    rows = []
    for e in ordered[:SHOWN]:
        row = {k: v for k, v in e.to_json().items() if k in keys}
        row["delta_loss_ci"] = _interval(e.delta_loss_ci)
        rows.append(row)
    c = result.circuit
    f = "-" if c.faithfulness is None else f"{c.faithfulness:.2f}"
    ci = "" if c.faithfulness_ci is None else f" (95 % CI {c.faithfulness_ci[0]:.2f} to {c.faithfulness_ci[1]:.2f})"
    note = (f"minimal circuit: {len(c.edges)} of {result.n_edges} edges keep {f}{ci} of the loss gap "
            f"(target {c.target:.0%}{'' if c.reached else ', not reached'}); "
            f"{len(result.edges)} edges verified by path patching, {max(len(ordered) - SHOWN, 0)} not shown")
    return Section("circuit_edges", "Circuit edges (path patching)", EDGE_COLUMNS, rows, note)
