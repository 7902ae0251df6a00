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
    Field("delta_logit_diff", "Δlogit diff", "+.3f"),
    Field("delta_logit_diff_ci", "Δlogit diff, 95 % CI", "s"),
    Field("p_value_loss_adjusted", "p (corrected)", ".2g"),
    Field("estimate", "estimated Δloss", "+.4f", "nats"),
    Field("in_circuit", "in circuit", "s"),
    Field("inclusion", "kept in resamples", ".0%"),
    Field("self_repair_gap", "self-repair gap", "+.4f", "nats"),
)
MEASURED = ("delta_logit_diff", "delta_logit_diff_ci")  # columns only where the data names wrong answers
SHOWN = 30  # rows of the edge table: the circuit's edges, then the largest others


def _interval(ci: list[float] | None, fmt: str = "+.4f") -> str | None:
    return None if ci is None else f"[{ci[0]:{fmt}}, {ci[1]:{fmt}}]"


def edge_section(result: Any) -> Section:
    """The verified edges, the circuit's first, then by delta loss, at most SHOWN rows."""
    diff = "logit_diff" in result.baseline
    columns = tuple(c for c in EDGE_COLUMNS if diff or c.key not in MEASURED)
    keys = {c.key for c in columns}
    ordered = [e for e in result.edges if e.in_circuit] + [e for e in result.edges if not e.in_circuit]
    rows = []
    for e in ordered[:SHOWN]:
        row = {k: v for k, v in e.to_json().items() if k in keys}
        row["delta_loss_ci"] = _interval(e.delta_loss_ci)
        if diff:
            row["delta_logit_diff_ci"] = _interval(e.delta_logit_diff_ci, "+.3f")
        rows.append(row)
    c = result.circuit
    f = "-" if c.faithfulness is None else _share(c.faithfulness, c.faithfulness_ci)
    ld = "" if c.faithfulness_logit_diff is None else \
        f" and {_share(c.faithfulness_logit_diff, c.faithfulness_logit_diff_ci)} of the logit difference's"
    note = (f"minimal circuit: {len(c.edges)} of {result.n_edges} edges keep {f} of the loss gap{ld} "
            f"(target {c.target:.0%}{'' if c.reached else ', not reached'}); "
            f"{len(result.edges)} edges verified by path patching, {max(len(ordered) - SHOWN, 0)} not shown")
    return Section("circuit_edges", "Circuit edges (path patching)", columns, rows, note)


def _share(f: float, ci: list[float] | None) -> str:
    return f"{f:.2f}" + ("" if ci is None else f" (95 % CI {ci[0]:.2f} to {ci[1]:.2f})")
