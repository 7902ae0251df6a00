"""A run folder boiled down to what `diagnose stats` shows: data first (summarize -> dict,
the `--json` output), then a rich rendering of that dict (render)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from .._terminal import plain
from ._runfolder import Run, layer_fields
from ._summary_more import more, render_more

SUMMARY_SCHEMA = "diagnose.run-summary/1"


def _float_or_none(x: Any) -> float | None:
    """A float, NaN/Inf kept (strict JSON writes them as null plus a `nonfinite` entry); None for missing."""
    if x is None or x is pd.NA:
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _last(df: pd.DataFrame, col: str) -> Any:
    """The value of `col` at the last logged step; a NaN there is shown, never skipped."""
    return df[col].iloc[-1] if col in df and len(df) else None


def summarize(run: Run) -> dict[str, Any]:
    """Steps, final loss, per-block grad norms and activations at the last step, attention
    entropy at the last sampled step, and every alert."""
    df = run.steps
    layers = []
    for name in run.layers:
        row = {"name": name}
        for f in layer_fields(df.columns):
            row[f] = _float_or_none(_last(df, f"layers/{name}/{f}"))
        col = f"layers/{name}/grad_norm"
        finite = pd.to_numeric(df[col], errors="coerce") if col in df else pd.Series(dtype=float)
        finite = finite[finite.map(lambda v: math.isfinite(v) if isinstance(v, float) else False)]
        row["grad_norm_median"] = _float_or_none(finite.median()) if len(finite) else None
        layers.append(row)
    attention = []
    if len(run.attention):
        last_step = run.attention["step"].max()
        at = run.attention[run.attention["step"] == last_step]
        for site, g in at.groupby("site", sort=False):
            attention.append({"site": site, "step": int(last_step),
                              "entropy": [_float_or_none(v) for v in g["entropy"]],
                              "max_weight": [_float_or_none(v) for v in g["max_weight"]]})
    loss = pd.to_numeric(df.get("loss"), errors="coerce") if "loss" in df else pd.Series(dtype=float)
    return {
        "schema": SUMMARY_SCHEMA,
        "run_dir": str(run.dir),
        "model": run.info.get("model", {}),
        "closed": run.closed,
        "sessions": len(run.info.get("sessions", [])),
        "steps_logged": int(len(df)),
        "first_step": int(df["step"].iloc[0]),
        "last_step": int(df["step"].iloc[-1]),
        "final_loss": _float_or_none(_last(df, "loss")),
        "min_loss": _float_or_none(loss.min()) if len(loss.dropna()) else None,
        "final_lr": _float_or_none(_last(df, "lr")),
        "final_grad_norm": _float_or_none(_last(df, "grad_norm")),
        "layers": layers,
        "attention": attention,
        "alerts": run.alerts,
        "skipped_lines": run.skipped_lines,
        **more(run),
    }


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:.4g}"
    return plain(v)


def alert_line(a: dict[str, Any]):
    """An alert as rich Text (two lines); every field is data, shown as text."""
    from rich.text import Text

    color = "red" if a.get("severity") == "error" else "yellow"
    return Text.assemble((f"step {plain(a.get('step'))} {plain(a.get('kind'))}", color),
                         f" at {plain(a.get('where'))}: {plain(a.get('message'))}\n    hint: {plain(a.get('hint'))}")


def render(summary: dict[str, Any], console) -> None:
    """Print a summary dict with rich (console: a rich.console.Console); data is never parsed as markup."""
    from rich.table import Table
    from rich.text import Text

    s = summary
    model = s["model"] if isinstance(s["model"], dict) else {}
    state = "closed" if s["closed"] else "open (still running, or killed)"
    n_params = model.get("n_params", 0)
    n_params = f"{n_params:,}" if isinstance(n_params, int) else plain(n_params)
    console.print(Text.assemble((plain(s["run_dir"]), "bold"), f"  {plain(model.get('class', '?'))}, "
                                f"{n_params} parameters, run {state}, {s['sessions']} session(s)"))
    console.print(Text(f"steps {s['first_step']}..{s['last_step']} ({s['steps_logged']} logged)   "
                       f"final loss {_fmt(s['final_loss'])} (min {_fmt(s['min_loss'])})   "
                       f"lr {_fmt(s['final_lr'])}   grad norm {_fmt(s['final_grad_norm'])}"))
    render_more(s, console)
    if s["skipped_lines"]:
        console.print(Text(f"{s['skipped_lines']} torn line(s) skipped", style="yellow"))
    t = Table(title="through depth (last logged step)", title_justify="left")
    for col in ("block", "grad norm", "median grad norm", "act mean", "act var", "max |act|", "token cos"):
        t.add_column(col, justify="left" if col == "block" else "right")
    for r in s["layers"]:
        t.add_row(*(Text(c) for c in (plain(r["name"]), _fmt(r["grad_norm"]), _fmt(r["grad_norm_median"]),
                                      _fmt(r["act_mean"]), _fmt(r["act_var"]), _fmt(r["act_max_abs"]),
                                      _fmt(r["token_cos"]))))
    console.print(t)
    if s["attention"]:
        t = Table(title=f"attention at step {s['attention'][0]['step']} (per head)", title_justify="left")
        t.add_column("site")
        t.add_column("entropy (nats)")
        t.add_column("max weight")
        for a in s["attention"]:
            t.add_row(Text(plain(a["site"])), Text(" ".join(_fmt(v) for v in a["entropy"])),
                      Text(" ".join(_fmt(v) for v in a["max_weight"])))
        console.print(t)
    if not s["alerts"]:
        console.print(Text("no alerts", style="green"))
    for a in s["alerts"]:
        console.print(alert_line(a))
