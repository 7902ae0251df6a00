"""`diagnose stats RUN --step N`: one logged step in full, and the batch saved behind a spike
alert there (spikes/step_N.*): data first (step_view -> dict, the --json output), then rendering."""

from __future__ import annotations

import math
import os
from typing import Any

from .._terminal import plain
from ..errors import RunFolderError
from ._fields import record_keys
from ._runfolder import Run
from ._spikes import SPIKES, read_spike, spike_stem, top_examples

TOP = 5  # examples shown, highest per-example loss first


def step_view(run: Run, step: int) -> dict[str, Any]:
    """The step's model-level fields (every declared one the record holds, then any other) and
    alerts, and what was saved for it (spike record + top examples)."""
    rec = next((r for r in run.records if r.get("step") == step), None)
    spike = next((s for s in run.spikes if s["step"] == step), None)
    record = run.dir / SPIKES / f"{spike_stem(step)}.json"
    if spike is None and os.path.lexists(record):  # skipped as damaged when the run was read: say why
        spike = read_spike(record)
    if rec is None and spike is None:
        logged = [r["step"] for r in run.records]
        saved = [s["step"] for s in run.spikes]
        raise RunFolderError(f"{run.dir}: step {step} was not logged (logged steps {logged[0]}..{logged[-1]}, "
                             f"{len(logged)} of them); give a logged step"
                             + (f" or one with a saved batch: {saved}" if saved else ""))
    view: dict[str, Any] = {"step": step, "record": {k: rec[k] for k in record_keys([rec], "model")} if rec else {},
                            "alerts": [a for a in run.alerts if a.get("step") == step], "spike": spike,
                            "examples": [], "saved_steps": [s["step"] for s in run.spikes]}
    if spike is not None:
        view["examples"] = top_examples(run.dir, step, TOP)
    return view


def _v(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "NaN" if math.isnan(x) else f"{x:.6g}"
    return plain(x)


def render_step(view: dict[str, Any], console) -> None:
    from rich.table import Table
    from rich.text import Text

    from ._summary import alert_line

    console.print(Text(f"step {view['step']}: " + "  ".join(f"{k} {_v(v)}" for k, v in view["record"].items()
                                                             if v is not None)))
    for a in view["alerts"]:
        console.print(alert_line(a))
    spike = view["spike"]
    if spike is None:
        saved = ", ".join(str(s) for s in view["saved_steps"]) or "none"
        console.print(Text(f"no batch saved at this step (saved at: {saved}; TrainingMonitor(save_spikes=True) "
                           f"and step(batch=...) save one)"))
        return
    console.print(Text(f"saved batch ({', '.join(plain(k) for k in spike.get('kinds', []))}): "
                       f"{spike.get('bytes')} bytes" + ("; truncated" if spike.get("truncated") else "")
                       + (f"; {plain(spike['note'])}" if spike.get("note") else "")))
    if spike.get("state"):  # what a replay needs was saved with it (_spike_state.py)
        console.print(Text(f"model and optimizer state saved: replay it with --replay {view['step']} --model MODEL"))
    elif spike.get("state_note"):
        console.print(Text(f"not replayable: {plain(spike['state_note'])}"))
    t = Table(title="tensors", title_justify="left")
    for col in ("name", "shape", "dtype"):
        t.add_column(col)
    for name, meta in (spike.get("tensors") or {}).items():
        t.add_row(Text(plain(name)), Text(plain(meta.get("shape"))), Text(plain(meta.get("dtype"))))
    console.print(t)
    if view["examples"]:
        t = Table(title=f"highest per-example loss (top {len(view['examples'])})", title_justify="left")
        for col in ("example", "loss", "input ids (first 32)"):
            t.add_column(col)
        for e in view["examples"]:
            t.add_row(Text(str(e["index"])), Text(_v(e["loss"])), Text(plain(" ".join(map(str, e.get("input_ids", []))))))
        console.print(t)
