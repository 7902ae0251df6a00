"""The verdict in a few sentences, generated from the view models (never written by hand):
what matters, what looks important but is not, what went wrong in training and when.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from diagnose.display import head_label

from diagnose.ablation.verdict import DETECTABLE, MATTERS, VERDICTS

from .view_heads import HeadsView
from ._view_training import LossSummary, TrainingView


@dataclass
class Verdict:
    title: str
    lines: list[tuple[str, str]] = field(default_factory=list)  # (label, sentence)


def _f(x: Any, spec: str = ".3f") -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return format(x, spec) if math.isfinite(x) else str(x)


def _signed(x: Any) -> str:
    return _f(x, "+.3f")


def _strength(rho: float) -> str:
    a = abs(rho)
    return "barely" if a < 0.2 else "weakly" if a < 0.4 else "moderately" if a < 0.7 else "strongly"


def _head_effect(h: dict[str, Any]) -> str:
    parts = []
    if h.get("delta_accuracy") is not None:
        parts.append(f"Δaccuracy {_signed(h.get('delta_accuracy'))}")
    if h.get("delta_loss") is not None:
        parts.append(f"Δloss {_signed(h.get('delta_loss'))}")
    if h.get("p_value_loss_adjusted") is not None:  # the test that decides: the corrected Δloss test
        parts.append(f"p(Δloss) = {_f(h.get('p_value_loss_adjusted'), '.2g')}")
    if h.get("verdict") in VERDICTS:
        parts.append(h["verdict"])
    return f"{head_label(h['layer'], h['head'])} ({', '.join(parts)})"


def _matters(v: HeadsView, top: str) -> str:
    """One language: a head matters when significant (corrected p < 0.05 on the paired Δ loss test) and
    outside the negligible band; significant inside the band is "detectable but negligible"."""
    n, small = v.n_verdict(MATTERS), v.n_verdict(DETECTABLE)
    rule = "significant, corrected p < 0.05 on the paired Δ loss test, and outside the negligible band"
    head = (f"{n} of {v.n_total} heads matter when removed ({rule})" if n else
            f"No single head matters when removed ({rule})")
    also = (f"; {small}{' more' if n else ''} {'is' if small == 1 else 'are'} detectable but negligible "
            "(significant, but inside the band)" if small else "")
    return f"{head}{also}; the largest effects: {top}."


def heads_verdict(v: HeadsView) -> Verdict:
    out = Verdict(f"Heads: {v.name}")
    base = ", ".join(f"{k} {_f(val)}" for k, val in v.baseline.items() if isinstance(val, (int, float)))
    n_ex = f" over {v.n_examples} examples" if v.n_examples else ""
    out.lines.append(("Model", f"{v.family} model, {v.n_layers} layers × {v.n_heads} heads, task "
                               f"{v.task or 'unknown'}, {v.method or 'zero'} ablation{n_ex}"
                               + (f"; baseline {base}." if base else ".")))
    if v.shared:
        out.lines.append(("Shared layers", v.shared))
    top = ", ".join(_head_effect(h) for h in v.ranked[:3])
    out.lines.append(("What matters", _matters(v, top)))
    firm = (f"{v.n_undecided:,} head(s) are firm under one method and undecided under another (the data "
            f"cannot tell, rather than the method): {_some(v.undecided, total=v.n_undecided)}") if v.undecided else ""
    if v.depends:
        out.lines.append(("Depends on the method", f"the verdict depends on the method for {v.n_depends:,} "
                                                   f"head(s): {_some(v.depends, total=v.n_depends)}"
                          + (f" Also, {firm}" if firm else "")))
    elif firm:
        out.lines.append(("Depends on the method", f"no head matters under one method and is negligible under "
                                                   f"another; {firm}"))
    elif v.compared:
        out.lines.append(("Depends on the method", f"no: every head's verdict is the same under "
                                                   f"{', '.join(v.compared)}."))
    inert = [f for f in v.flags if f.kind == "striking_but_inert"]
    vital = [f for f in v.flags if f.kind == "diffuse_but_vital"]
    together = [f for f in v.flags if f.kind == "redundant_group"]
    other = [f for f in v.flags if f.kind not in ("striking_but_inert", "diffuse_but_vital", "redundant_group")]
    if inert:
        out.lines.append(("Looks important but is not", "; ".join(
            f"{f.label}: {f.reason}" if f.reason else f.label for f in inert[:4])
            + (f"; and {len(inert) - 4} more." if len(inert) > 4 else ".")))
    else:
        out.lines.append(("Looks important but is not", "no head was flagged as a striking map without "
                                                         "a causal effect."))
    if vital:
        out.lines.append(("Matters though its map looks diffuse", "; ".join(
            f"{f.label}: {f.reason}" if f.reason else f.label for f in vital[:4]) + "."))
    if together:
        out.lines.append(("Matter only together", "; ".join(f.reason for f in together[:4]) + "."))
    if other:
        out.lines.append(("Other flags", "; ".join(f"{f.label} ({f.kind})" for f in other[:4]) + "."))
    corr = {(c.statistic, c.effect): c for c in v.correlations}
    c = corr.get(("max_weight", "delta_loss"))
    if c is not None:
        g = corr.get(("grad_importance", "delta_loss"))
        extra = (f"; gradient importance tracks it {_strength(g.rho)} (ρ = {_f(g.rho, '.2f')})"
                 if g is not None else "")
        out.lines.append(("Heatmap vs cause", f"across heads, how peaked a map is (max weight) "
                                              f"{_strength(c.rho)} predicts the loss increase on removal "
                                              f"(Spearman ρ = {_f(c.rho, '.2f')}, p = {_f(c.p_value, '.2g')})"
                                              f"{extra}."))
    return out


def loss_sentence(s: LossSummary) -> str:
    """Start, end, minimum, maximum, and where the loss stopped being finite: the logged values
    themselves, no smoothing; a non-finite last loss is said, never replaced by an earlier one."""
    def at(value: float, step: int | None) -> str:
        return f"{_f(value, '.4g')} at step {step}" if step is not None else "n/a"

    text = (f"loss {at(s.start, s.start_step)} (first logged) → {at(s.end, s.end_step)} (last logged); "
            f"minimum {at(s.min, s.min_step)}, maximum {at(s.max, s.max_step)}")
    if s.nonfinite_from is not None:
        text += (f"; not finite from step {s.nonfinite_from} on ({s.nonfinite_count} logged steps)"
                 if not s.finite_again else
                 f"; not finite at {s.nonfinite_count} logged steps, first at step {s.nonfinite_from}")
    return text


def _extras(v: TrainingView) -> list[str]:
    """Evaluations, throughput and clipping in a few words, where the run has them."""
    out = []
    if v.evals is not None and v.evals.last():
        last = ", ".join(f"{name} {_f(val, '.4g')}" for name, val in v.evals.last())
        out.append(f"{len(v.evals.steps)} evaluations, the last: {last}")
    if v.tokens_per_s_median is not None:
        out.append(f"median {_f(v.tokens_per_s_median, ',.0f')} tokens/s")
    c = v.clipping
    if c is not None and c.clip is not None:
        share = f", scaling {c.share:.0%} of the logged steps" if c.share is not None else ""
        out.append(f"gradients clipped at {_f(c.clip, '.3g')}{share}")
    return out


def training_verdict(v: TrainingView) -> Verdict:
    out = Verdict(f"Training: {v.name}")
    span = f"steps {v.first_step}–{v.last_step}" if v.first_step is not None else "no step numbers"
    state = "" if v.closed else " The run was not closed (still running, or killed)."
    out.lines.append(("Run", f"{v.n_records} logged steps ({span}); {loss_sentence(v.loss_summary)}.{state}"))
    extras = _extras(v)
    if extras:
        out.lines.append(("Also logged", "; ".join(extras) + "."))
    if not v.alert_groups:
        out.lines.append(("What went wrong", "nothing: no alert was raised."))
        return out
    parts = []
    for g in v.alert_groups[:4]:
        where = f" in {g.where}" if g.where else ""
        times = f" ({g.count}× up to step {g.last_step})" if g.count > 1 else ""
        parts.append(f"[{g.number}] {g.kind} ({g.severity}) first at step {g.first_step}{where}{times}: "
                     f"{g.message}")
    more = f"; and {len(v.alert_groups) - 4} more kinds" if len(v.alert_groups) > 4 else ""
    out.lines.append(("What went wrong, and when", "; ".join(parts) + more + "."))
    first = v.alert_groups[0]
    if first.hint:
        out.lines.append(("First fix to try", first.hint))
    return out


def checks_line(findings: list[dict[str, Any]]) -> str:
    """One sentence for one checks document: its problems (warnings and errors) by title."""
    problems = [f for f in findings if f.get("severity") in ("warning", "error")]
    if not problems:
        return "no check found a problem" + (f" ({len(findings)} informational finding(s))." if findings else ".")
    errors = sum(1 for f in problems if f.get("severity") == "error")
    titles = "; ".join(f"{f.get('title') or f.get('check')} ({f.get('severity')})" for f in problems[:5])
    return f"{len(problems)} problem(s), {errors} error(s): {titles}."


def checks_verdict(items: list[tuple[str, list[dict[str, Any]]]]) -> Verdict:
    """All checks documents in one block, a line each: (source name, findings)."""
    return Verdict("Checks", [(name, checks_line(findings)) for name, findings in items])


def format_cell(value: Any, fmt: Any) -> str:
    """A number through a format spec (".3f"); anything else, or a spec that does not fit, as str."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(fmt, str) and fmt != "s":
        try:
            return format(value, fmt)
        except (ValueError, TypeError, OverflowError):  # a spec that does not fit; 10**400 as ".3f"
            pass
    return "–" if value is None else str(value)


def lessons_verdict(lessons: list[dict[str, Any]]) -> Verdict:
    """Each measured lesson in a line: its claim and its first measure, (a) against (b)."""
    out = Verdict("Lessons, measured")
    for les in lessons:
        rows = [r for r in les.get("rows", []) if isinstance(r, dict)]
        first = ""
        if rows:
            r, fmt = rows[0], rows[0].get("fmt")

            def cell(x: Any) -> str:
                return format_cell(x, fmt)
            first = f" Measured: {r.get('metric')} {cell(r.get('a'))} ({les.get('a')}) vs {cell(r.get('b'))} " \
                    f"({les.get('b')})."
        out.lines.append((str(les.get("title") or les.get("key") or ""), f"{les.get('claim', '')}{first}"))
    return out


def _some(labels: list[str], shown: int = 6, total: int | None = None) -> str:
    """The first `shown` labels, and how many more (of `total`, when the list itself stops short of it)."""
    total = len(labels) if total is None else total
    return "; ".join(labels[:shown]) + (f"; and {total - shown:,} more." if total > shown else ".")
