"""Heads over training, read back from a run folder: the info events in words, and each head's
importance and role at every sampled step (`diagnose stats RUN` and `--heads`, the report).

Torch-free: it reads `Run.attention` (the tidy per-head table, whatever fields it holds) and
`Run.alerts`. A head's role at a step is the role statistic (statistics.roles(), restricted to
the shares the monitor records) holding the most of its attention when that share is at least
ROLE_SHARE, else "broad".
"""

from __future__ import annotations

import math
from typing import Any

from .._head_label import head_label
from ..statistics import BROAD, roles
from ._head_events import INFO_KINDS, ROLE_STATS

ROLE_SHARE = 0.4  # a share of a head's attention at least this names its role at that step
SCHEMA = "diagnose.run-heads/1"


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def role_at(row: dict[str, Any]) -> str:
    """The role label of one head at one step, from its recorded shares."""
    named = roles()
    shares = [(row.get(s), s) for s in ROLE_STATS if s in named and _num(row.get(s)) is not None]
    if not shares:
        return BROAD
    share, stat = max(shares)
    return named[stat].label if share >= ROLE_SHARE else BROAD


def heads_summary(run: Any) -> dict[str, Any]:
    """{schema, events: the info alerts (step, kind, where, message), steps: the sampled steps with an
    importance, heads: per head {layer, head, site, label, importance [per step], role [per step],
    final_share: its share of the model's importance at the last sampled step}}."""
    events = [{k: a.get(k) for k in ("step", "kind", "where", "message")}
              for a in run.alerts if a.get("kind") in INFO_KINDS]
    df = run.attention
    if not len(df) or "importance" not in df:
        return {"schema": SCHEMA, "events": events, "steps": [], "heads": []}
    df = df[df["importance"].map(lambda v: _num(v) is not None)]
    steps = sorted({int(s) for s in df["step"]})
    sites = list(dict.fromkeys(df["site"]))
    heads = []
    for layer, site in enumerate(sites):
        part = df[df["site"] == site]
        for h in sorted({int(x) for x in part["head"]}):
            rows = {int(r["step"]): r for r in part[part["head"] == h].to_dict("records")}
            heads.append({"layer": layer, "head": h, "site": site, "label": head_label(layer, h),
                          "importance": [_num(rows[s]["importance"]) if s in rows else None for s in steps],
                          "role": [role_at(rows[s]) if s in rows else None for s in steps]})
    total = sum(h["importance"][-1] or 0.0 for h in heads) if steps else 0.0
    for h in heads:
        h["final_share"] = (h["importance"][-1] or 0.0) / total if total > 0 else None
    return {"schema": SCHEMA, "events": events, "steps": steps, "heads": heads}


def head_event_lines(summary: dict[str, Any]) -> list[str]:
    """The heads section of `diagnose stats`: one sentence per event, in step order."""
    if not summary["events"]:
        return ["heads: no head event (no head became vital or changed role, no in-context phase change)"
                if summary["heads"] else "heads: no per-head importance recorded"]
    out = ["heads:"]
    for e in sorted(summary["events"], key=lambda e: e["step"]):
        what = {"head_vital": "became vital", "induction_head": "became an induction head",
                "induction_phase_change": "the induction phase change"}.get(e["kind"], e["kind"])
        out.append(f"  step {e['step']}: {e['where']} {what}" if e["where"] != "model"
                   else f"  step {e['step']}: {what}: {e['message']}")
    return out


def head_rows(summary: dict[str, Any], columns: int = 10) -> tuple[list[str], list[list[str]]]:
    """`stats --heads`: the header (head, then at most `columns` sampled steps, evenly spaced, the last
    included) and per head its importance and role letter at each, most important at the end first."""
    steps = summary["steps"]
    if not steps:
        return [], []
    idx = sorted({round(i * (len(steps) - 1) / max(1, columns - 1)) for i in range(min(columns, len(steps)))})
    letters = {r.label: r.letter for r in roles().values()}
    letters[BROAD] = "B"
    rows = []
    for h in sorted(summary["heads"], key=lambda h: -(h["importance"][-1] or 0.0)):
        cells = [h["label"]]
        for i in idx:
            v, role = h["importance"][i], h["role"][i]
            cells.append("-" if v is None else f"{v:.3g} {letters.get(role, '?')}")
        rows.append(cells)
    return ["head"] + [f"step {steps[i]}" for i in idx], rows
