"""The prune section: Michel et al.'s curve (accuracy and loss against the fraction of heads
removed), the removal order, the heads left per layer, and the before/after figures, from a
`diagnose.prune/1` JSON document."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from diagnose.files import kind, number
from diagnose.errors import InputFileError

from ._figures import new_figure, to_data_uri

PRUNE_SCHEMA = "diagnose.prune/1"


@dataclass
class PruneSection:
    name: str
    data: dict[str, Any]
    curve_img: str
    rows: list[tuple[str, str]]  # (what, figure) for the summary table
    layers: list[tuple[int, int, int]]  # (layer, heads before, heads left)


_FIX = "regenerate it with `diagnose prune --json`"
MAX_ROWS = 1 << 16  # curve points, removals, layers: a model with more heads is not a real document
_OBJECTS = {"budget": ("max_drop", "max_loss"), "verify": ("max_abs_diff", "tolerance"),
            "size": ("forward_seconds_before", "forward_seconds_after", "speedup")}
_COUNTS = {"size": ("parameters_before", "parameters_after", "batch", "threads")}


class _Fields:
    """The field checks of one document: each returns the value made plain, or raises InputFileError
    naming the field and the fix."""

    def __init__(self, where: str):
        self.where = where

    def bad(self, field: str, value: Any, want: str) -> InputFileError:
        return InputFileError(f"{self.where}: `{field}` is {kind(value)}, not {want}; {_FIX}")

    def num(self, value: Any, field: str) -> float | None:  # the one conversion: a float, or None for null
        if value is None:
            return None
        if number(value) is None:
            raise self.bad(field, value, "a number")
        return number(value)

    def count(self, value: Any, field: str, optional: bool = True) -> int | None:
        if value is None and optional:
            return None
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value):
            raise self.bad(field, value, "a count (an integer, 0 or more)")
        return value

    def obj(self, value: Any, field: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.bad(field, value, "an object")
        return value

    def rows(self, value: Any, field: str) -> list[Any]:
        if not isinstance(value, list) or len(value) > MAX_ROWS:
            raise self.bad(field, value, f"a list (of at most {MAX_ROWS:,})")
        return value

    def scores(self, row: dict[str, Any], field: str) -> dict[str, float]:
        """accuracy and loss of a curve point or removal, NaN where diagnose wrote null."""
        return {k: _nan(self.num(row.get(k), f"{field}.{k}")) for k in ("accuracy", "loss")}


def check_prune(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The document with every field the section reads checked and its numbers made floats (None
    where diagnose wrote null for a NaN); InputFileError naming the field otherwise."""
    f = _Fields(where)
    out = dict(data)
    _check_heads(f, data, out)
    _check_curve(f, data, out)
    _check_figures(f, data, out)
    return out


def _check_heads(f: _Fields, data: dict[str, Any], out: dict[str, Any]) -> None:
    model = f.obj(data.get("model"), "model")
    n_heads = [f.count(x, f"model.n_heads[{i}]", False) for i, x in enumerate(f.rows(model.get("n_heads"),
                                                                                    "model.n_heads"))]
    left = [f.count(x, f"heads_left[{i}]", False) for i, x in enumerate(f.rows(data.get("heads_left"), "heads_left"))]
    if len(left) != len(n_heads) or any(a > b for a, b in zip(left, n_heads)):
        raise InputFileError(f"{f.where}: `heads_left` must give, for each layer of `model.n_heads`, at most its "
                             f"heads; {_FIX}")
    out["model"] = {**model, "n_heads": n_heads}
    out["heads_left"] = left


def _check_curve(f: _Fields, data: dict[str, Any], out: dict[str, Any]) -> None:
    """The curve and the removal order."""
    curve = f.rows(data.get("curve"), "curve")
    if not curve:
        raise InputFileError(f"{f.where}: `curve` is empty; a {PRUNE_SCHEMA} curve starts with the unpruned model; "
                             f"{_FIX}")
    out["curve"] = []
    for i, p in enumerate(curve):
        p = f.obj(p, f"curve[{i}]")
        x = f.num(p.get("fraction_removed"), f"curve[{i}].fraction_removed")
        if x is None or not math.isfinite(x):
            raise f.bad(f"curve[{i}].fraction_removed", p.get("fraction_removed"), "a finite number")
        out["curve"].append({**p, "fraction_removed": x, "n_removed": f.count(p.get("n_removed"),
                                                                              f"curve[{i}].n_removed"),
                             **f.scores(p, f"curve[{i}]")})
    out["order"] = []
    for i, o in enumerate(f.rows(data.get("order"), "order")):
        o = f.obj(o, f"order[{i}]")
        out["order"].append({**o, "layer": f.count(o.get("layer"), f"order[{i}].layer", False),
                             "head": f.count(o.get("head"), f"order[{i}].head", False), **f.scores(o, f"order[{i}]")})


def _check_figures(f: _Fields, data: dict[str, Any], out: dict[str, Any]) -> None:
    """The totals, budget, verification, size, before/after figures, stop and notes."""
    out["n_removed"] = f.count(data.get("n_removed"), "n_removed")
    out["fraction_removed"] = f.num(data.get("fraction_removed"), "fraction_removed")
    for key, fields in _OBJECTS.items():
        o = f.obj(data.get(key), key)
        out[key] = {**o, **{k: f.num(o.get(k), f"{key}.{k}") for k in fields if k in o}}
    for k in _COUNTS["size"]:
        if k in out["size"]:
            out["size"][k] = f.count(out["size"][k], f"size.{k}")
    for key in ("data", "eval"):
        part = f.obj(data.get(key), key)
        clean = {**part, "noise": f.num(part.get("noise"), f"{key}.noise")}
        for side in ("before", "after"):
            half = f.obj(part.get(side), f"{key}.{side}")
            clean[side] = {k: f.num(half.get(k), f"{key}.{side}.{k}") for k in ("accuracy", "loss")}
        out[key] = clean if part else None
    stop = f.obj(data.get("stop"), "stop")
    if stop.get("reason") is not None and not isinstance(stop["reason"], str):
        raise f.bad("stop.reason", stop["reason"], "text")
    nxt = f.obj(stop.get("next"), "stop.next")
    out["stop"] = {**stop, "next": {k: f.num(nxt.get(k), f"stop.next.{k}") for k in ("accuracy", "loss")}
                   if nxt else None}
    notes = data.get("notes") or []
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise f.bad("notes", notes, "a list of text")
    out["notes"] = notes


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def prune_section(name: str, data: dict[str, Any]) -> PruneSection:
    before, left = data["model"]["n_heads"], data["heads_left"]
    return PruneSection(name, data, _curve(data), _rows(data), [(i, b, a) for i, (b, a) in enumerate(zip(before, left))])


def prune_verdict_lines(s: PruneSection) -> list[tuple[str, str]]:
    d = s.data
    removed = d["n_removed"] if d.get("n_removed") is not None else len(d["order"])
    lines = [("removed", f"{removed} of {sum(d['model']['n_heads'])} heads "
                         f"({_pct(d.get('fraction_removed'))})")]
    ev = d.get("eval")
    if isinstance(ev, dict) and isinstance(ev.get("before"), dict):
        lines.append(("held-out accuracy", f"{_pct(ev['before'].get('accuracy'))} → {_pct(ev['after'].get('accuracy'))} "
                                           f"(sampling noise ±{_pct(ev.get('noise'))})"))
    size = d.get("size") or {}
    if _is_number(size.get("parameters_before")) and _is_number(size.get("parameters_after")):
        lines.append(("parameters", f"{size['parameters_before']:,} → {size['parameters_after']:,}"))
    return lines


def _rows(d: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    budget = d.get("budget") or {}
    if _is_number(budget.get("max_drop")):
        rows.append(("budget", f"at most {budget['max_drop']:g} accuracy points on the choice data"))
    if _is_number(budget.get("max_loss")):
        rows.append(("budget", f"at most +{budget['max_loss']:g} loss on the choice data"))
    data = d.get("data") or {}
    for label, part in (("choice data", data), ("held-out data", d.get("eval") or {})):
        b, a = part.get("before"), part.get("after")
        if isinstance(b, dict) and isinstance(a, dict):
            rows.append((f"{label}: accuracy", f"{_pct(b.get('accuracy'))} → {_pct(a.get('accuracy'))} "
                                               f"(noise ±{_pct(part.get('noise'))})"))
            rows.append((f"{label}: loss", f"{_fmt(b.get('loss'))} → {_fmt(a.get('loss'))}"))
    size = d.get("size") or {}
    if _is_number(size.get("parameters_before")) and _is_number(size.get("parameters_after")):
        rows.append(("parameters", f"{size['parameters_before']:,} → {size['parameters_after']:,}"))
    if _is_number(size.get("forward_seconds_before")) and _is_number(size.get("forward_seconds_after")):
        rows.append(("forward time", f"{size['forward_seconds_before'] * 1e3:.1f} ms → "
                                     f"{size['forward_seconds_after'] * 1e3:.1f} ms (batch {size.get('batch')}, "
                                     f"{size.get('threads')} threads)"))
    v = d.get("verify") or {}
    if _is_number(v.get("max_abs_diff")):
        rows.append(("pruned vs gated outputs", f"max |diff| {v['max_abs_diff']:.2g}"))
    stop = d.get("stop") or {}
    if isinstance(stop.get("reason"), str):
        rows.append(("stopped", stop["reason"]))
    return rows


def _curve(d: dict[str, Any]) -> str:
    pts = d["curve"]
    x = [_plotted(100 * p["fraction_removed"]) for p in pts]
    fig = new_figure(6.4, 2.6, left=0.7, right=0.7, wspace=0.45)
    ax = fig.add_subplot(1, 2, 1)
    ax.plot(x, [_plotted(100 * p["accuracy"]) for p in pts], marker=".", color="#1565c0")
    base = _plotted(100 * pts[0]["accuracy"])
    drop = (d.get("budget") or {}).get("max_drop")
    if _is_number(drop) and 0 <= drop <= 100 and math.isfinite(base):  # accuracy points: a line on the plot
        ax.axhline(base - drop, color="#c62828", lw=0.8, ls="--")
    ax.set_xlabel("heads removed (%)")
    ax.set_ylabel("accuracy (%)")
    ax2 = fig.add_subplot(1, 2, 2)
    ax2.plot(x, [_plotted(p["loss"]) for p in pts], marker=".", color="#ef8f00")
    nxt, total = (d.get("stop") or {}).get("next"), sum(d["model"]["n_heads"])
    if isinstance(nxt, dict) and _is_number(nxt.get("accuracy")) and _is_number(nxt.get("loss")) and total:
        at = 100 * (pts[-1]["n_removed"] + 1) / total if _is_number(pts[-1].get("n_removed")) else x[-1]
        ax.plot([_plotted(at)], [_plotted(100 * nxt["accuracy"])], "x", color="#c62828")  # the removal it refused
        ax2.plot([_plotted(at)], [_plotted(nxt["loss"])], "x", color="#c62828")
    ax2.set_xlabel("heads removed (%)")
    ax2.set_ylabel("loss")
    return to_data_uri(fig)


def _is_number(v: Any) -> bool:
    """Whether a field holds a number a float can hold (the one test, `diagnose._numbers.number`)."""
    return number(v) is not None


def _plotted(v: float) -> float:
    """A value matplotlib can lay an axis around; a gap (NaN) for anything else (1e308 is finite,
    yet an axis around it cannot be drawn)."""
    return v if math.isfinite(v) and abs(v) < 1e15 else math.nan


def _pct(v: Any) -> str:
    return f"{100 * v:.1f} %" if _is_number(v) else "–"


def _fmt(v: Any) -> str:
    return f"{v:.4f}" if _is_number(v) else "–"
