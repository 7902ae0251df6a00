"""Events of the heads over training, severity `info`: what a head became, not a failure.

Three detectors on the sampled steps' per-head records (_head_importance.py):

- `head_vital`: a head whose importance (|d loss / d gate|) rose from negligible (at least
  `vital_rise` x its lowest sample so far) to among the model's top heads (the top quarter, at
  least one) at this sample.
- `induction_head`: a head whose induction share (its attention on the token after an earlier
  copy of the query's token, Olsson et al. 2022's prefix matching) reached `induction_share` and
  at least `induction_rise` x its first sample.
- `induction_phase_change`: the in-context score (late-position loss minus early-position loss)
  fell by `icl_drop` (0.5) x the early-position loss below its highest earlier sample: the phase
  change in which induction heads form (once per run). Perfect copying takes the late loss to 0, a
  drop of the whole early loss, so the event marks the middle of the largest drop a context can give.

They are written to alerts.jsonl like every alert, with severity "info"; they never stop a run
(raise_on refuses their kinds) and, having no cooldown, each head is announced at its own sample.
`where` names the heads ("L0.H1, L1.H0"; the phase change: "model").
"""

from __future__ import annotations

import math
from typing import Any

from .._head_label import head_label
from ._detect import Context, Detector, Emit, finite

ROLE_STATS = ("first_token", "prev_token", "induction", "duplicate_token")  # the role shares recorded per head
INFO_HINT = "not a failure: see `diagnose stats RUN --heads` for each head's importance and role over the run"


def _heads(rec: dict[str, Any], field: str):
    """(layer index, site, head, value) of every finite per-head `field` in the record, sites in order."""
    for layer, (site, st) in enumerate((rec.get("attention") or {}).items()):
        for h, v in enumerate(st.get(field) or []):
            if finite(v):
                yield layer, site, h, float(v)


def head_scalars(record: dict[str, Any], prefix: str = "diagnose/") -> dict[str, float]:
    """The live sinks' per-head view of a sampled record: `diagnose/heads/L0.H1/importance` and each role
    share, named by the head as every table names it (the same numbers as under `attention/<site>/`)."""
    out = {}
    for row in ("importance",) + ROLE_STATS:
        for layer, _site, h, v in _heads(record, row):
            out[f"{prefix}heads/{head_label(layer, h)}/{row}"] = v
    return out


class HeadVital(Detector):
    """A head that went from negligible to among the model's most important heads."""

    kind, severity, hint = "head_vital", "info", INFO_HINT
    defaults = {"vital_rise": 10.0, "vital_top": 0.25}

    def __init__(self) -> None:
        self.low: dict[tuple[int, int], float] = {}  # per head, its lowest importance so far
        self.vital: set[tuple[int, int]] = set()

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        now = list(_heads(rec, "importance"))
        if not now:
            return emit(False, "", "")
        top = max(1, math.ceil(min(ctx.threshold("vital_top"), 1.0) * len(now)))  # a share of the heads
        ranked = sorted(now, key=lambda t: -t[3])[:top]
        new = []
        for layer, site, h, v in ranked:
            low = self.low.get((layer, h))
            if (layer, h) not in self.vital and low is not None and v >= ctx.threshold("vital_rise") * max(low, 1e-30):
                self.vital.add((layer, h))
                new.append(f"{head_label(layer, h)} ({site}) importance {v:.3g}, {v / max(low, 1e-30):.0f}x its lowest")
        for layer, _site, h, v in now:
            self.low[(layer, h)] = min(self.low.get((layer, h), v), v)
        where = ", ".join(s.split(" ")[0] for s in new)
        emit(bool(new), where, f"became vital, among the model's top {top} of {len(now)} heads: " + "; ".join(new))


class InductionHead(Detector):
    """A head whose attention turned to the token after an earlier copy of the current one."""

    kind, severity, hint = "induction_head", "info", INFO_HINT
    defaults = {"induction_share": 0.4, "induction_rise": 2.0}

    def __init__(self) -> None:
        self.first: dict[tuple[int, int], float] = {}
        self.named: set[tuple[int, int]] = set()

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        new = []
        for layer, site, h, v in _heads(rec, "induction"):
            first = self.first.setdefault((layer, h), v)
            if ((layer, h) not in self.named and v >= ctx.threshold("induction_share")
                    and v >= ctx.threshold("induction_rise") * first):
                self.named.add((layer, h))
                new.append((head_label(layer, h), f"{head_label(layer, h)} ({site}) induction share "
                                                  f"{first:.2f} -> {v:.2f}"))
        emit(bool(new), ", ".join(n for n, _ in new), "became an induction head: " + "; ".join(m for _, m in new))


class InductionPhaseChange(Detector):
    """The in-context score's drop: the loss late in the sequence fell well below the loss early in it."""

    kind, severity, hint = "induction_phase_change", "info", INFO_HINT
    defaults = {"icl_drop": 0.5}

    def __init__(self) -> None:
        self.high: float | None = None  # the highest in-context score so far
        self.done = False

    def check(self, rec: dict[str, Any], ctx: Context, emit: Emit) -> None:
        score, early = rec.get("icl_score"), rec.get("icl_early")
        if not (finite(score) and finite(early)):
            return emit(False, "", "")
        fired = (not self.done and self.high is not None
                 and score <= self.high - ctx.threshold("icl_drop") * abs(early))
        message = (f"the in-context score fell to {score:.3f} nats (late-position loss "
                   f"{rec.get('icl_late', math.nan):.3f} against {early:.3f} early), from {self.high or 0:.3f}: "
                   "the model learned to use its context (the induction phase change)")
        self.high = score if self.high is None else max(self.high, score)
        self.done = self.done or fired
        emit(fired, "model", message)


HEAD_EVENTS = (HeadVital, InductionHead, InductionPhaseChange)
INFO_KINDS = tuple(d.kind for d in HEAD_EVENTS)
