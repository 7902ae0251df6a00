"""What `diagnose stats` adds to the summary for evaluations, throughput, clipping and saved
spike batches: data first (more(run) -> dict, merged into the --json summary), then its rendering."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from .._terminal import plain
from ._actions import read_skips
from ._runfolder import Run


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    if name not in df:
        return pd.Series(dtype=float)
    values = pd.to_numeric(df[name], errors="coerce")
    return values[values.map(math.isfinite)]


def _f(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def more(run: Run) -> dict[str, Any]:
    """evals (count, last and best loss with their steps), throughput (median seconds per step and
    tokens/s over the logged steps, and at the last one), clipping (the threshold and the share of
    logged steps whose update it scaled), the steps with a saved spike batch, and skips.json's entries
    (the steps whose update skip_on dropped, or where stop_on stopped the run)."""
    ev, df = run.evals, run.steps
    losses = _col(ev, "loss")
    evals = {"count": int(len(ev)),
             "last_step": int(ev["step"].iloc[-1]) if len(ev) else None,
             "last_loss": float(ev["loss"].iloc[-1]) if len(ev) else None,  # a NaN is shown, not hidden
             "best_loss": _f(losses.min()) if len(losses) else None,
             "best_step": int(ev["step"][losses.idxmin()]) if len(losses) else None,
             "metrics": [c for c in ev.columns if c not in ("step", "time", "loss", "session")]}
    step_time, tps, sink_time = _col(df, "step_time"), _col(df, "tokens_per_s"), _col(df, "sink_time")
    throughput = {"median_step_time": _f(step_time.median()) if len(step_time) else None,
                  "median_tokens_per_s": _f(tps.median()) if len(tps) else None,
                  "median_sink_time": _f(sink_time.median()) if len(sink_time) else None,  # the user sinks'
                  "last_step_time": _f(step_time.iloc[-1]) if len(step_time) else None,
                  "last_tokens_per_s": _f(tps.iloc[-1]) if len(tps) else None}
    coef = _col(df, "clip_coef")
    clipping = {"clip": run.info.get("clip", (run.info.get("settings") or {}).get("clip")),
                "clipped_share": _f((coef < 1.0).mean()) if len(coef) else None}
    return {"evals": evals, "throughput": throughput, "clipping": clipping,
            "spike_steps": [s["step"] for s in run.spikes], "skips": read_skips(run.dir)}


def _g(v: Any, fmt: str = ".4g") -> str:
    return "-" if v is None else format(v, fmt)


def render_more(s: dict[str, Any], console) -> None:
    """Print the lines of more()'s dict that have something to say."""
    from rich.text import Text

    t, ev, c = s.get("throughput") or {}, s.get("evals") or {}, s.get("clipping") or {}
    if t.get("median_step_time") is not None:
        console.print(Text(f"step time median {_g(t['median_step_time'])} s (last {_g(t['last_step_time'])} s)   "
                           f"tokens/s median {_g(t['median_tokens_per_s'], '.4g')} "
                           f"(last {_g(t['last_tokens_per_s'], '.4g')})"
                           + (f"   sinks median {_g(t['median_sink_time'])} s/step (not in step time)"
                              if t.get("median_sink_time") is not None else "")))
    if c.get("clip") is not None:
        share = c.get("clipped_share")
        console.print(Text(f"clipping at {_g(c['clip'])}: {'-' if share is None else f'{100 * share:.0f} %'} "
                           f"of logged steps scaled"))
    if ev.get("count"):
        names = ", ".join(plain(m) for m in ev["metrics"])
        console.print(Text(f"evals {ev['count']}: last loss {_g(ev['last_loss'])} at step {ev['last_step']}, "
                           f"best {_g(ev['best_loss'])} at step {ev['best_step']}"
                           + (f"; metrics {names}" if names else "")))
    if s.get("spike_steps"):
        steps = ", ".join(str(x) for x in s["spike_steps"])
        console.print(Text(f"spike batches saved at steps {steps} (diagnose stats RUN --step N)"))
    for e in s.get("skips") or []:
        batch = f", batch spikes/{plain(e['batch'])}" if e.get("batch") else ""
        why = f" ({plain(e['why'])})" if e.get("why") else ""
        console.print(Text(f"step {e['step']} {plain(e['action']).replace('_', ' ')} on "
                           f"{', '.join(plain(k) for k in e['kinds'])}{batch}{why}", style="yellow"))
