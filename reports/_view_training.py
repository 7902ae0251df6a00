"""View model of one training run (a `diagnose.read_run` Run): decimated curves, per-layer
matrices through depth over time, per-head attention entropy, and alerts grouped by kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ._decimate import bin_mean, minmax

MAX_POINTS = 2000  # per line, min/max preserving
MAX_BINS = 400  # columns of the depth-over-time maps and samples per entropy curve
MAX_ALERT_ROWS = 200
Series = tuple[np.ndarray, np.ndarray]


@dataclass
class AlertGroup:
    number: int  # the label drawn on the curves
    kind: str
    severity: str
    first_step: int | None
    last_step: int | None
    count: int
    where: str
    message: str
    hint: str


@dataclass
class HeadEntropy:
    steps: np.ndarray  # [S] (bin centres)
    values: np.ndarray  # [S, rows], one row per (site, head)
    rows: list[tuple[str, int]]  # (site, head) in forward order


@dataclass
class TrainingView:
    name: str
    n_records: int
    first_step: int | None
    last_step: int | None
    closed: bool
    info: list[tuple[str, str]]
    loss: Series
    lr: Series
    grad_norm: Series
    layer_names: list[str]
    layer_grad: dict[str, Series]
    act_var: tuple[np.ndarray, np.ndarray] | None  # (steps [bins], [bins, layers])
    token_cos: tuple[np.ndarray, np.ndarray] | None
    entropy: HeadEntropy | None
    alert_groups: list[AlertGroup]
    alerts: list[dict[str, Any]]  # first MAX_ALERT_ROWS, in order
    n_alerts: int
    loss_start: float
    loss_end: float
    skipped_lines: int = 0
    notes: list[str] = field(default_factory=list)


# Beyond this, matplotlib cannot lay out an axis (its tick arithmetic overflows): such values
# are drawn as what they practically are, infinite.
_DRAWABLE = 1e300


def _column(df: pd.DataFrame, name: str) -> np.ndarray:
    if name not in df.columns:
        return np.full(len(df), np.nan)
    values = np.array(pd.to_numeric(df[name], errors="coerce"), dtype=float)  # a copy: it is written below
    huge = np.abs(values) > _DRAWABLE
    values[huge] = np.copysign(np.inf, values[huge])
    return values


def _series(steps: np.ndarray, values: np.ndarray) -> Series:
    return minmax(steps, values, MAX_POINTS)


def _layer_names(run: Any, df: pd.DataFrame) -> list[str]:
    names = list(getattr(run, "layers", None) or [])
    seen = [c.split("/")[1] for c in df.columns if c.startswith("layers/") and c.count("/") >= 2]
    for n in seen:  # keep forward order from run.json; add any block it does not list
        if n not in names:
            names.append(n)
    return [n for n in names if any(c.startswith(f"layers/{n}/") for c in df.columns)]


def _depth_map(df: pd.DataFrame, steps: np.ndarray, names: list[str], key: str, log: bool):
    cols = [f"layers/{n}/{key}" for n in names]
    if not any(c in df.columns for c in cols):
        return None
    m = np.stack([_column(df, c) for c in cols], axis=1)  # [steps, layers]
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            m = np.where(m > 0, np.log10(np.where(m > 0, m, 1.0)), np.nan)
    return bin_mean(steps, m, MAX_BINS)


def _entropy(run: Any) -> HeadEntropy | None:
    att = getattr(run, "attention", None)
    if not isinstance(att, pd.DataFrame) or att.empty or "entropy" not in att.columns:
        return None
    table = att.pivot_table(index="step", columns=["site", "head"], values="entropy", aggfunc="mean")
    order = {site: i for i, site in enumerate(dict.fromkeys(att["site"]))}  # first seen = forward order
    rows = sorted(table.columns, key=lambda c: (order[c[0]], c[1]))
    values = np.array(table[rows], dtype=float)  # [steps, heads]
    values[np.abs(values) > _DRAWABLE] = np.nan  # an entropy beyond 1e300 is damage, not a value to draw
    x, m = bin_mean(table.index.to_numpy(dtype=float), values, MAX_BINS)
    return HeadEntropy(x, m, [(str(site), int(head)) for site, head in rows])


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def group_alerts(alerts: list[dict[str, Any]]) -> list[AlertGroup]:
    """One group per alert kind, numbered by first occurrence, errors before warnings at a tie."""
    groups: dict[str, AlertGroup] = {}
    for a in alerts:
        kind = str(a.get("kind", "alert"))
        step = _int(a.get("step"))
        g = groups.get(kind)
        if g is None:
            groups[kind] = AlertGroup(0, kind, str(a.get("severity", "warning")), step, step, 1,
                                      str(a.get("where", "")), str(a.get("message", "")), str(a.get("hint", "")))
            continue
        g.count += 1
        if step is not None:
            g.first_step = step if g.first_step is None else min(g.first_step, step)
            g.last_step = step if g.last_step is None else max(g.last_step, step)
        if a.get("severity") == "error":
            g.severity = "error"
    ordered = sorted(groups.values(), key=lambda g: (math.inf if g.first_step is None else g.first_step,
                                                     g.severity != "error"))
    for i, g in enumerate(ordered, 1):
        g.number = i
    return ordered


def _edge_mean(values: np.ndarray, first: bool) -> float:
    finite = values[np.isfinite(values)]
    if not len(finite):
        return math.nan
    k = max(1, len(finite) // 20)
    return float(np.mean(finite[:k] if first else finite[-k:]))


def _info(info: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    model = info.get("model") or {}
    for key, value in (model.items() if isinstance(model, dict) else []):
        if key != "blocks" and not isinstance(value, (dict, list)):
            rows.append((f"model {key}", str(value)))
    if isinstance(model, dict) and isinstance(model.get("blocks"), list):
        rows.append(("blocks", str(len(model["blocks"]))))
    for key, value in (info.get("settings") or {}).items():
        if not isinstance(value, (dict, list)):
            rows.append((key, str(value)))
    if info.get("started"):
        rows.append(("started", str(info["started"])))
    return rows


def training_view(name: str, run: Any) -> TrainingView:
    """Build the view of one run; every curve is decimated for the page."""
    df = run.steps
    steps = _column(df, "step")
    loss = _column(df, "loss")
    names = _layer_names(run, df)
    alerts = list(run.alerts or [])
    notes = []
    if getattr(run, "skipped_lines", 0):
        notes.append(f"{run.skipped_lines} unreadable line(s) skipped (a torn write)")
    finite_steps = steps[np.isfinite(steps)]
    info = getattr(run, "info", {}) or {}
    return TrainingView(
        name=name, n_records=len(df),
        first_step=int(finite_steps.min()) if len(finite_steps) else None,
        last_step=int(finite_steps.max()) if len(finite_steps) else None,
        closed=bool(info.get("closed")), info=_info(info),
        loss=_series(steps, loss), lr=_series(steps, _column(df, "lr")),
        grad_norm=_series(steps, _column(df, "grad_norm")), layer_names=names,
        layer_grad={n: _series(steps, _column(df, f"layers/{n}/grad_norm")) for n in names},
        act_var=_depth_map(df, steps, names, "act_var", log=True),
        token_cos=_depth_map(df, steps, names, "token_cos", log=False),
        entropy=_entropy(run), alert_groups=group_alerts(alerts), alerts=alerts[:MAX_ALERT_ROWS],
        n_alerts=len(alerts), loss_start=_edge_mean(loss, True), loss_end=_edge_mean(loss, False),
        skipped_lines=int(getattr(run, "skipped_lines", 0) or 0), notes=notes)
