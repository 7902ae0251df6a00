"""A run folder boiled down to what `diagnose stats` shows: data first (summarize -> dict,
the `--json` output), then a rich rendering of that dict (render)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from .._terminal import plain
from ._fields import field_of
from ._runfolder import Run
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
    """Steps, final loss, every declared (and undeclared) model-level field at the last step
    (`last`), each block's fields at the last step, each site's per-head fields at the last sampled
    step, and every alert."""
    df = run.steps
    layers = []
    for name in run.layers:
        row = {"name": name}
        for f in run.fields("layer"):
            row[f] = _float_or_none(_last(df, f"layers/{name}/{f}"))
        col = f"layers/{name}/grad_norm"
        finite = pd.to_numeric(df[col], errors="coerce") if col in df else pd.Series(dtype=float)
        finite = finite[finite.map(lambda v: math.isfinite(v) if isinstance(v, float) else False)]
        row["grad_norm_median"] = _float_or_none(finite.median()) if len(finite) else None
        layers.append(row)
    last = {k: _value(run.records[-1].get(k)) for k in run.fields("model")} if run.records else {}
    return _summary(run, df, layers, _attention(run), last)


def _value(v: Any) -> Any:
    """A record's top-level value for the summary: a number as a float, a word as it is, a list
    (one lr per parameter group) of floats."""
    if isinstance(v, list):
        return [_float_or_none(x) for x in v]
    return v if isinstance(v, str) else _float_or_none(v)


def _attention(run: Run) -> list[dict[str, Any]]:
    """Per site at the last sampled step: each per-head field (a list, one per head) and each
    per-site number."""
    if not len(run.attention):
        return []
    last_step = run.attention["step"].max()
    at = run.attention[run.attention["step"] == last_step]
    rec = next((r for r in reversed(run.records) if r.get("step") == last_step), {})
    out = []
    for site, g in at.groupby("site", sort=False):
        row = {"site": site, "step": int(last_step)}
        row.update({k: [_float_or_none(v) for v in g[k]] for k in run.fields("head") if k in g})
        stats = (rec.get("attention") or {}).get(site) or {}
        row.update({k: _float_or_none(stats[k]) for k in run.fields("site") if k in stats})
        out.append(row)
    return out


def _summary(run: Run, df: pd.DataFrame, layers: list, attention: list, last: dict) -> dict[str, Any]:
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
        "last": last,
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
    """Print a summary dict with rich (console: a rich.console.Console); data is never parsed as markup.
    Its tables walk the declared fields (labels, units, formats) and show undeclared ones by name."""
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
    _model_table(s, console)
    _depth_table(s, console)
    _attention_table(s, console)
    if not s["alerts"]:
        console.print(Text("no alerts", style="green"))
    for a in s["alerts"]:
        console.print(alert_line(a))


def _cell(f, v: Any) -> str:
    """A value in its field's format; NaN and infinities spelled as the JSON's readers know them."""
    if isinstance(v, list):
        return ",".join(_cell(f, x) for x in v)
    if isinstance(v, float) and not math.isfinite(v):
        return _fmt(v)
    return plain(f.format(v))


def _shown(per: str, keys) -> list:
    """The fields of these keys that are shown in the CLI (a field declared for the JSON only is not)."""
    return [f for f in (field_of(per, k) for k in keys) if "cli" in f.show]


def _table(title: str, columns: list[str], rows: list[list[str]], console) -> None:
    """The one table printer of `diagnose stats`: the first column left, the others right."""
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        t.add_column(Text(col), justify="left" if i == 0 else "right")  # a header is data, not markup
    for r in rows:
        t.add_row(*(Text(c) for c in r))
    console.print(t)


def _model_table(s: dict[str, Any], console) -> None:
    last = s.get("last") or {}
    fields = _shown("model", last)
    if fields:
        _table("model fields (last logged step)", [f.header for f in fields],
               [[_cell(f, last[f.key]) for f in fields]], console)


def _depth_table(s: dict[str, Any], console) -> None:
    keys = list(dict.fromkeys(k for r in s["layers"] for k in r if k not in ("name", "grad_norm_median")))
    fields = _shown("layer", keys)
    columns, rows = ["block"], []
    for f in fields:
        columns += [f.header] + (["median grad norm"] if f.key == "grad_norm" else [])
    for r in s["layers"]:
        cells = [plain(r["name"])]
        for f in fields:
            cells += [_cell(f, r.get(f.key))] + ([_fmt(r.get("grad_norm_median"))] if f.key == "grad_norm" else [])
        rows.append(cells)
    _table("through depth (last logged step)", columns, rows, console)


def _attention_table(s: dict[str, Any], console) -> None:
    if not s["attention"]:
        return
    keys = list(dict.fromkeys(k for a in s["attention"] for k in a if k not in ("site", "step")))
    fields = [f for k in keys for f in _shown("head" if any(isinstance(a.get(k), list) for a in s["attention"])
                                              else "site", [k])]
    rows = [[plain(a["site"])] + [(" ".join(_cell(f, v) for v in a[f.key]) if isinstance(a.get(f.key), list)
                                   else _cell(f, a.get(f.key))) for f in fields] for a in s["attention"]]
    _table(f"attention at step {s['attention'][0]['step']} (per head)", ["site"] + [f.header for f in fields],
           rows, console)
