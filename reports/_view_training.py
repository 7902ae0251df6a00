"""View model of one training run (a `diagnose.read_run` Run): decimated curves, per-layer
matrices through depth over time, per-head attention entropy, alerts grouped by kind, what the
loss did (LossSummary), and the run's evaluations, throughput, clipping and saved spike batches.

Every panel of every run in a report is drawn on one step axis (`xlim`, set by the report to the
span of all its runs), so that an alert's line falls at the same place in each picture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from diagnose.monitor import field_of
from diagnose.schema import Section

from ._decimate import bin_mean, minmax
from ._run_extras import Clipping, Evals, Spike, clipping, evals, spikes
from ._run_fields import field_tables
from ._view_heads_training import HeadsOverTraining, heads_over_training

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
    steps: np.ndarray  # [S] the step each column starts at: where its (first) sample was taken
    values: np.ndarray  # [S, rows], one row per (site, head)
    rows: list[tuple[str, int]]  # (site, head) in forward order
    uniform: float | None = None  # entropy of uniform attention over the visible keys (log T), largest site's
    label: str = "entropy [nats]"  # the field's header: the colour bar's label


def column_edges(x: np.ndarray, last_step: float | None) -> np.ndarray:
    """[S + 1] edges of columns that start at the steps x [S]: each sample holds from the step it was
    taken at until the next sample; the last until the run's last logged step (one sampling interval
    when it was taken there)."""
    gap = float(np.median(np.diff(x))) if len(x) > 1 else 1.0
    end = float(last_step) if last_step is not None and last_step > x[-1] else float(x[-1]) + gap
    return np.append(np.asarray(x, dtype=float), end)


@dataclass
class LossSummary:
    """What the loss did, from the logged values themselves (no smoothing): the first and the last
    logged loss (the last may be NaN: it is shown, never skipped), the finite minimum and maximum,
    and where the loss stopped being finite."""

    start: float
    start_step: int | None
    end: float
    end_step: int | None
    min: float
    min_step: int | None
    max: float
    max_step: int | None
    nonfinite_from: int | None  # the first step whose loss is NaN or infinite
    nonfinite_count: int  # logged steps with a non-finite loss
    finite_again: bool  # a finite loss was logged after nonfinite_from


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
    loss_summary: LossSummary
    skipped_lines: int = 0
    notes: list[str] = field(default_factory=list)
    evals: Evals | None = None
    tokens_per_s: Series | None = None
    tokens_per_s_median: float | None = None  # over every logged step that has it
    step_time: Series | None = None
    clipping: Clipping | None = None
    spikes: list[Spike] = field(default_factory=list)
    fields: list[Section] = field(default_factory=list)  # every record field the run holds (_run_fields)
    head_maps: list[HeadEntropy] = field(default_factory=list)  # the other per-head fields declared for plots
    depth_maps: list[tuple[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=list)  # (header, map)
    curves: list[tuple[str, Series]] = field(default_factory=list)  # (header, line): the other model-level plots
    xlim: tuple[float, float] = (0.0, 1.0)  # the report's shared step axis
    heads_over: HeadsOverTraining | None = None  # every head's importance and the head events (the monitor's)
    prefix: str = ""  # "2." before alert numbers when the report holds several runs
    color: str = "#1565c0"  # this run's colour where runs are overlaid


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
    return _binned_from_start(steps, m)


def _binned_from_start(steps: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """bin_mean over time, each column labelled with the step it starts at (not its centre)."""
    if len(steps) <= MAX_BINS:
        return steps, m
    edges = np.linspace(0, len(steps), MAX_BINS + 1).astype(int)
    _, values = bin_mean(steps, m, MAX_BINS)
    return steps[edges[:-1]], values


def _uniform_entropy(run: Any) -> float | None:
    """The largest uniform-attention entropy (log of the visible keys' count) the records carry."""
    best = None
    for rec in getattr(run, "records", None) or []:
        for st in (rec.get("attention") or {}).values():
            u = st.get("uniform_entropy") if isinstance(st, dict) else None
            if isinstance(u, (int, float)) and not isinstance(u, bool) and math.isfinite(u) and u > 0:
                best = u if best is None else max(best, u)
    return best


def _head_map(run: Any, key: str) -> HeadEntropy | None:
    """One per-head field over time, one row per (site, head) in forward order; None without it."""
    att = getattr(run, "attention", None)
    if not isinstance(att, pd.DataFrame) or att.empty or key not in att.columns:
        return None
    table = att.pivot_table(index="step", columns=["site", "head"], values=key, aggfunc="mean")
    order = {site: i for i, site in enumerate(dict.fromkeys(att["site"]))}  # first seen = forward order
    rows = sorted(table.columns, key=lambda c: (order[c[0]], c[1]))
    values = np.array(table[rows], dtype=float)  # [samples, heads]
    values[np.abs(values) > _DRAWABLE] = np.nan  # a value beyond 1e300 is damage, not a value to draw
    steps, values = _binned_from_start(table.index.to_numpy(dtype=float), values)  # [S], [S, heads]
    return HeadEntropy(steps, values, [(str(site), int(head)) for site, head in rows],
                       label=field_of("head", key).header)


def _entropy(run: Any) -> HeadEntropy | None:
    e = _head_map(run, "entropy")
    if e is not None:
        e.uniform = _uniform_entropy(run)
    return e


_DRAWN = ("grad_norm", "act_var", "token_cos")  # per-block fields with a picture of their own above


def _depth_maps(run: Any, df: pd.DataFrame, steps: np.ndarray, names: list[str]) -> list:
    """(header, map) for each other per-block field whose declaration asks for a plot."""
    keys = list(dict.fromkeys(c.rsplit("/", 1)[1] for c in df.columns if c.startswith("layers/")))
    out = []
    for k in keys:
        f = field_of("layer", k)
        m = _depth_map(df, steps, names, k, log=False) if "plot" in f.show and k not in _DRAWN else None
        if m is not None:
            out.append((f.header, m))
    return out


_DRAWN_MODEL = ("loss", "grad_norm", "lr", "tokens_per_s", "step_time")  # model-level, in figures of their own


def _curves(df: pd.DataFrame, steps: np.ndarray) -> list[tuple[str, Series]]:
    """(header, line) for each other model-level field whose declaration asks for a plot, in column order; a
    field sampled on some steps only (icl_score) is drawn through the steps that hold it."""
    out = []
    for key in (c for c in df.columns if "/" not in c and c != "step" and c not in _DRAWN_MODEL):
        f = field_of("model", key)
        y = _column(df, key) if "plot" in f.show else np.zeros(0)
        held = np.isfinite(y)
        if held.any():
            out.append((f.header, _series(steps[held], y[held])))
    return out


def _head_maps(run: Any) -> list[HeadEntropy]:
    """The per-head fields other than the entropy and the importance (each drawn on its own: the importance
    per layer, _view_heads_training.py) whose declaration asks for a plot."""
    att = getattr(run, "attention", None)
    keys = [c for c in att.columns if c not in ("step", "site", "head", "entropy", "importance")] if isinstance(
        att, pd.DataFrame) else []
    maps = [_head_map(run, k) for k in keys if "plot" in field_of("head", k).show]
    return [m for m in maps if m is not None]


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


def loss_summary(steps: np.ndarray, loss: np.ndarray) -> LossSummary:
    """Start, end, finite minimum and maximum, and where the loss stopped being finite."""
    ok = np.isfinite(loss)
    bad = np.flatnonzero(~ok & np.isfinite(steps)) if len(loss) else np.zeros(0, dtype=int)
    first_bad = int(bad[0]) if len(bad) else None

    def at(i: int | None) -> tuple[float, int | None]:
        return (math.nan, None) if i is None else (float(loss[i]), _int(steps[i]))

    i_min = int(np.flatnonzero(ok)[np.argmin(loss[ok])]) if ok.any() else None
    i_max = int(np.flatnonzero(ok)[np.argmax(loss[ok])]) if ok.any() else None
    return LossSummary(*at(0 if len(loss) else None), *at(len(loss) - 1 if len(loss) else None),
                       *at(i_min), *at(i_max),
                       nonfinite_from=None if first_bad is None else _int(steps[first_bad]),
                       nonfinite_count=int((~ok).sum()),
                       finite_again=first_bad is not None and bool(ok[first_bad:].any()))


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
    tps, step_time = _column(df, "tokens_per_s"), _column(df, "step_time")
    lo, hi = (float(finite_steps.min()), float(finite_steps.max())) if len(finite_steps) else (0.0, 1.0)
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
        n_alerts=len(alerts), loss_summary=loss_summary(steps, loss),
        skipped_lines=int(getattr(run, "skipped_lines", 0) or 0), notes=notes, evals=evals(run),
        tokens_per_s=_series(steps, tps) if np.isfinite(tps).any() else None,
        tokens_per_s_median=float(np.median(tps[np.isfinite(tps)])) if np.isfinite(tps).any() else None,
        step_time=_series(steps, step_time) if np.isfinite(step_time).any() else None,
        clipping=clipping(run, _column(df, "clip_coef")), spikes=spikes(run), fields=field_tables(run),
        head_maps=_head_maps(run), heads_over=heads_over_training(run), depth_maps=_depth_maps(run, df, steps, names), curves=_curves(df, steps), xlim=(lo, max(hi, lo + 1.0)))
