"""What a run folder holds besides the step records, as the report shows it: evaluations
(evals.jsonl), throughput (step_time, tokens_per_s), clipping (run.json's `clip` and each
step's `clip_coef`) and the batches saved at spike alerts (spikes/step_N.json).

All of it is optional: a folder written before these fields existed gives empty values and the
report leaves the sections out. The files are read once, by `read_run` (`Run.evals`,
`Run.spikes`), which skips and counts what does not parse (a torn line, a damaged spike
record): these are side files, and the report must still show the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd


Series = tuple[np.ndarray, np.ndarray]
MAX_SPIKE_ROWS = 50


@dataclass
class Evals:
    steps: np.ndarray  # [E] the steps evaluated at
    loss: np.ndarray  # [E] NaN where an evaluation logged no loss
    metrics: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [E]

    def last(self) -> list[tuple[str, float]]:
        """(name, value) at the last evaluation that has it: loss first, then each metric."""
        out = []
        for name, values in (("loss", self.loss), *self.metrics.items()):
            finite = values[np.isfinite(values)]
            if len(finite):
                out.append((name, float(finite[-1])))
        return out


@dataclass
class Clipping:
    clip: float | None  # the threshold, when the loop said it clips
    share: float | None  # share of logged steps whose update clipping scaled (clip_coef < 1)
    n_steps: int  # logged steps with a clip coefficient


@dataclass
class Spike:
    step: int
    kinds: list[str]
    tensors: list[tuple[str, str, str]]  # (name, shape, dtype)
    bytes: int | None
    truncated: bool
    note: str


def _numbers(values: Any) -> np.ndarray:
    return np.array(pd.to_numeric(pd.Series(values, dtype=object), errors="coerce"), dtype=float)


def _eval_frame(run: Any) -> pd.DataFrame | None:
    """read_run's evaluations (it skips and counts damaged lines); None for a run without them."""
    frame = getattr(run, "evals", None)
    return frame if isinstance(frame, pd.DataFrame) else None


def evals(run: Any) -> Evals | None:
    """The run's evaluations, in step order; None when it has none."""
    frame = _eval_frame(run)
    if frame is None or frame.empty or "step" not in frame:
        return None
    frame = frame.sort_values("step", kind="stable")
    metrics = {str(c): _numbers(frame[c]) for c in frame.columns if c not in ("step", "time", "loss", "session")}
    loss = _numbers(frame["loss"]) if "loss" in frame else np.full(len(frame), np.nan)
    return Evals(_numbers(frame["step"]), loss, {k: v for k, v in metrics.items() if np.isfinite(v).any()})


def clipping(run: Any, clip_coef: np.ndarray) -> Clipping | None:
    """The clip threshold (run.json `clip`, or `settings.clip` in older folders) and how often it bit."""
    info = getattr(run, "info", {}) or {}
    clip = info.get("clip", (info.get("settings") or {}).get("clip"))
    clip = float(clip) if isinstance(clip, (int, float)) and not isinstance(clip, bool) and math.isfinite(clip) else None
    known = clip_coef[np.isfinite(clip_coef)]
    if clip is None and not len(known):
        return None
    return Clipping(clip, float((known < 1.0).mean()) if len(known) else None, int(len(known)))


def _spike_records(run: Any) -> list[dict[str, Any]]:
    """read_run's spike records (damaged ones already skipped and counted); [] when none."""
    records = getattr(run, "spikes", None)
    return records if isinstance(records, list) else []


def spikes(run: Any) -> list[Spike]:
    """The saved spike batches, by step (the first MAX_SPIKE_ROWS)."""
    out = []
    for rec in _spike_records(run):
        step = rec.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        tensors = rec.get("tensors") if isinstance(rec.get("tensors"), dict) else {}
        rows = [(str(name), "×".join(str(d) for d in (t.get("shape") or [])) if isinstance(t, dict) else "",
                 str(t.get("dtype", "")) if isinstance(t, dict) else "") for name, t in tensors.items()]
        size = rec.get("bytes")
        out.append(Spike(step, [str(k) for k in rec.get("kinds") or []], rows,
                         size if isinstance(size, int) and not isinstance(size, bool) else None,
                         bool(rec.get("truncated")), str(rec.get("note") or "")))
    return sorted(out, key=lambda s: s.step)[:MAX_SPIKE_ROWS]
