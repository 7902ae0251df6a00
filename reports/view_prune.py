"""The prune section: Michel et al.'s curve (accuracy and loss against the fraction of heads
removed), the removal order, the heads left per layer, and the before/after figures, from a
`diagnose.prune/1` JSON document."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


def check_prune(data: dict[str, Any], where: str) -> None:
    """Raise InputFileError unless the document has what the section draws."""
    curve, model, left = data.get("curve"), data.get("model"), data.get("heads_left")
    ok = (isinstance(curve, list) and curve and all(
        isinstance(p, dict) and all(_num(p.get(k)) for k in ("fraction_removed", "accuracy", "loss")) for p in curve)
        and isinstance(model, dict) and isinstance(model.get("n_heads"), list)
        and isinstance(left, list) and len(left) == len(model["n_heads"])
        and all(isinstance(x, int) for x in [*left, *model["n_heads"]]) and isinstance(data.get("order"), list))
    if not ok:
        raise InputFileError(f"{where}: a {PRUNE_SCHEMA} document needs `curve` (fraction_removed, accuracy, loss "
                             "per point), `order`, `heads_left` and `model.n_heads` per layer; regenerate it with "
                             "`diagnose prune --json`")


def prune_section(name: str, data: dict[str, Any]) -> PruneSection:
    before, left = data["model"]["n_heads"], data["heads_left"]
    return PruneSection(name, data, _curve(data), _rows(data), [(i, b, a) for i, (b, a) in enumerate(zip(before, left))])


def prune_verdict_lines(s: PruneSection) -> list[tuple[str, str]]:
    d = s.data
    lines = [("removed", f"{d.get('n_removed', len(d['order']))} of {sum(d['model']['n_heads'])} heads "
                         f"({_pct(d.get('fraction_removed'))})")]
    ev = d.get("eval")
    if isinstance(ev, dict) and isinstance(ev.get("before"), dict):
        lines.append(("held-out accuracy", f"{_pct(ev['before'].get('accuracy'))} → {_pct(ev['after'].get('accuracy'))} "
                                           f"(sampling noise ±{_pct(ev.get('noise'))})"))
    size = d.get("size") or {}
    if _num(size.get("parameters_before")) and _num(size.get("parameters_after")):
        lines.append(("parameters", f"{size['parameters_before']:,} → {size['parameters_after']:,}"))
    return lines


def _rows(d: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    budget = d.get("budget") or {}
    if _num(budget.get("max_drop")):
        rows.append(("budget", f"at most {budget['max_drop']:g} accuracy points on the choice data"))
    if _num(budget.get("max_loss")):
        rows.append(("budget", f"at most +{budget['max_loss']:g} loss on the choice data"))
    data = d.get("data") or {}
    for label, part in (("choice data", data), ("held-out data", d.get("eval") or {})):
        b, a = part.get("before"), part.get("after")
        if isinstance(b, dict) and isinstance(a, dict):
            rows.append((f"{label}: accuracy", f"{_pct(b.get('accuracy'))} → {_pct(a.get('accuracy'))} "
                                               f"(noise ±{_pct(part.get('noise'))})"))
            rows.append((f"{label}: loss", f"{_fmt(b.get('loss'))} → {_fmt(a.get('loss'))}"))
    size = d.get("size") or {}
    if _num(size.get("parameters_before")):
        rows.append(("parameters", f"{size['parameters_before']:,} → {size.get('parameters_after', 0):,}"))
    if _num(size.get("forward_seconds_before")) and _num(size.get("forward_seconds_after")):
        rows.append(("forward time", f"{size['forward_seconds_before'] * 1e3:.1f} ms → "
                                     f"{size['forward_seconds_after'] * 1e3:.1f} ms (batch {size.get('batch')}, "
                                     f"{size.get('threads')} threads)"))
    v = d.get("verify") or {}
    if _num(v.get("max_abs_diff")):
        rows.append(("pruned vs gated outputs", f"max |diff| {v['max_abs_diff']:.2g}"))
    stop = d.get("stop") or {}
    if isinstance(stop.get("reason"), str):
        rows.append(("stopped", stop["reason"]))
    return rows


def _curve(d: dict[str, Any]) -> str:
    pts = d["curve"]
    x = [100 * p["fraction_removed"] for p in pts]
    fig = new_figure(6.4, 2.6, left=0.7, right=0.7, wspace=0.45)
    ax = fig.add_subplot(1, 2, 1)
    ax.plot(x, [100 * p["accuracy"] for p in pts], marker=".", color="#1565c0")
    base = 100 * pts[0]["accuracy"]
    drop = (d.get("budget") or {}).get("max_drop")
    if _num(drop):
        ax.axhline(base - drop, color="#c62828", lw=0.8, ls="--")
    ax.set_xlabel("heads removed (%)")
    ax.set_ylabel("accuracy (%)")
    ax2 = fig.add_subplot(1, 2, 2)
    ax2.plot(x, [p["loss"] for p in pts], marker=".", color="#ef8f00")
    nxt, total = (d.get("stop") or {}).get("next"), sum(d["model"]["n_heads"])
    if isinstance(nxt, dict) and _num(nxt.get("accuracy")) and _num(nxt.get("loss")) and total:
        at = 100 * (pts[-1]["n_removed"] + 1) / total if _num(pts[-1].get("n_removed")) else x[-1]
        ax.plot([at], [100 * nxt["accuracy"]], "x", color="#c62828")  # the removal it refused
        ax2.plot([at], [nxt["loss"]], "x", color="#c62828")
    ax2.set_xlabel("heads removed (%)")
    ax2.set_ylabel("loss")
    return to_data_uri(fig)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _pct(v: Any) -> str:
    return f"{100 * v:.1f} %" if _num(v) else "–"


def _fmt(v: Any) -> str:
    return f"{v:.4f}" if _num(v) else "–"
