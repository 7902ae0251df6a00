"""View model of a run's heads over training: every head's importance at every sampled step, one map per
attention layer, the heads that matter at the end, and the info events (head_vital, induction_head,
induction_phase_change) to mark on the loss curve.

Read through `diagnose.monitor._heads_summary.heads_summary`, the one reader `diagnose stats` uses too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diagnose.monitor import heads_summary

TOP_SHARE = 0.25  # the heads that matter at the end: the top quarter by importance at the last sample (as head_vital)
MAX_LINES = 8  # lines drawn, most important at the end first


@dataclass
class HeadEvent:
    step: int
    kind: str
    where: str  # "L1.H0, L1.H1" or "model"
    message: str


@dataclass
class HeadsOverTraining:
    steps: np.ndarray  # [S] the sampled steps with an importance
    layers: list[tuple[str, np.ndarray]]  # (site, [S, heads]) per attention layer, forward order
    lines: list[tuple[str, np.ndarray]]  # (head label, [S]) the heads that matter at the end
    events: list[HeadEvent] = field(default_factory=list)  # the head events, in step order


def _values(xs: list) -> np.ndarray:
    return np.array([math.nan if x is None else x for x in xs], dtype=float)


def _events(summary: dict[str, Any]) -> list[HeadEvent]:
    out = [HeadEvent(int(e["step"]), str(e["kind"]), str(e.get("where") or ""), str(e.get("message") or ""))
           for e in summary["events"] if isinstance(e.get("step"), (int, float)) and math.isfinite(e["step"])]
    return sorted(out, key=lambda e: e.step)


def _at_the_end(heads: list[dict[str, Any]], events: list[HeadEvent]) -> list[dict[str, Any]]:
    """The top quarter of heads by their last importance (at least one), then any head an event names."""
    ranked = sorted(heads, key=lambda h: -(h["importance"][-1] or 0.0))
    chosen = ranked[:max(1, math.ceil(TOP_SHARE * len(heads)))]
    named = {w.strip() for e in events for w in e.where.split(",")}
    chosen += [h for h in ranked if h["label"] in named and h not in chosen]
    return chosen[:MAX_LINES]


def heads_over_training(run: Any) -> HeadsOverTraining | None:
    """None when the run recorded no per-head importance."""
    summary = heads_summary(run)
    if not summary["steps"]:
        return None
    events = _events(summary)
    sites = list(dict.fromkeys(h["site"] for h in summary["heads"]))
    layers = [(site, np.stack([_values(h["importance"]) for h in summary["heads"] if h["site"] == site], axis=1))
              for site in sites]  # each [S, heads]
    lines = [(h["label"], _values(h["importance"])) for h in _at_the_end(summary["heads"], events)]
    return HeadsOverTraining(np.array(summary["steps"], dtype=float), layers, lines, events)
