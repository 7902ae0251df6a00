"""The whole report as one view model: verdicts, per-source sections with their pictures, and
the one data blob handed to the page's script (attention maps for the selector)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagnose.display import head_label
from diagnose.head_fields import INTERVALS, REPORT_TABLE, REPORT_TABLE_MEASURED, by_key
from diagnose.schema import Field, Section
from diagnose.statistics import shown

from . import _plots_heads as plots_heads, _plots_heads_training as plots_heads_training
from . import _plots_training as plots_training
from ._sources import Sources
from ._summary import Verdict, checks_verdict, format_cell, heads_verdict, lessons_verdict, training_verdict
from .view_heads import MAP_BYTE_BUDGET, HeadsView, heads_view
from .view_circuit import CircuitSection, circuit_section, links_for
from .view_checkpoints import CheckpointsSection, checkpoints_verdict_lines
from .view_prune import PruneSection, prune_section, prune_verdict_lines
from ._view_training import TrainingView, training_view


@dataclass
class HeadsSection:
    view: HeadsView
    grids_img: str | None
    attention_img: str | None
    scatter_img: str | None
    top: Section  # the heads whose removal hurts most, as a table the one macro draws
    flag_rows: list[tuple[Any, dict[str, Any]]]  # (Flag, its head record)
    correlations: list[tuple[str, Any, Any]]  # (statistic, vs Δloss, vs Δaccuracy)
    note: str = ""  # why there are no pictures, when there are none
    per_layer: bool = False  # grids drawn as images, without numbers: list every layer's values on the page
    sections: list[Section] = field(default_factory=list)  # the analysis steps' tables, drawn by one macro
    circuit: CircuitSection | None = None  # the circuit of the same model, when the report has one
    circuit_links: dict[str, str] = field(default_factory=dict)  # a head's label -> its row in that circuit


@dataclass
class TrainingSection:
    view: TrainingView
    images: list[tuple[str, str]]  # (caption, data URI)


@dataclass
class CompareSection:
    """Several runs overlaid on shared axes, with a row of numbers per run."""
    image: str
    views: list[TrainingView]


@dataclass
class FindingView:
    check: str
    severity: str
    title: str
    evidence_text: str
    evidence_rows: list[tuple[str, str]]
    fix: str


@dataclass
class ChecksSection:
    name: str
    findings: list[FindingView]
    passed: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (check, why)


@dataclass
class LessonView:
    title: str
    claim: str
    a: str  # the textbook choice
    b: str  # the one it warns against
    rows: list[tuple[str, str, str]]  # (measure, value with a, value with b)
    runs: list[str]


@dataclass
class LessonsSection:
    name: str
    lessons: list[LessonView]


@dataclass
class Report:
    title: str
    source_names: list[str]
    verdicts: list[Verdict] = field(default_factory=list)
    heads: list[HeadsSection] = field(default_factory=list)
    training: list[TrainingSection] = field(default_factory=list)
    compare: CompareSection | None = None
    checks: list[ChecksSection] = field(default_factory=list)
    lessons: list[LessonsSection] = field(default_factory=list)
    prune: list[PruneSection] = field(default_factory=list)
    circuit: list[CircuitSection] = field(default_factory=list)
    checkpoints: list[CheckpointsSection] = field(default_factory=list)
    blob: dict[str, Any] = field(default_factory=dict)


def _finding(raw: dict[str, Any]) -> FindingView:
    ev = raw.get("evidence")
    rows: list[tuple[str, str]] = []
    text = ""
    if isinstance(ev, dict):
        rows = [(str(k), str(v)) for k, v in ev.items()]
    elif isinstance(ev, list):
        rows = [("", str(v)) for v in ev]
    elif ev is not None:
        text = str(ev)
    return FindingView(str(raw.get("check", "")), str(raw.get("severity", "warning")),
                   str(raw.get("title") or raw.get("check") or "finding"), text, rows, str(raw.get("fix", "")))


def _cell(value: Any, fmt: Any) -> str:
    return format_cell(value, fmt)


def _lesson(raw: dict[str, Any]) -> LessonView:
    rows = [(str(r.get("metric", "")), _cell(r.get("a"), r.get("fmt")), _cell(r.get("b"), r.get("fmt")))
            for r in raw.get("rows", []) if isinstance(r, dict)]
    return LessonView(str(raw.get("title") or raw.get("key") or ""), str(raw.get("claim") or ""),
                  str(raw.get("a") or "a"), str(raw.get("b") or "b"), rows, [str(r) for r in raw.get("runs") or []])


def _tables(v: HeadsView) -> tuple[list, list]:
    by_head = {(h["layer"], h["head"]): h for h in v.ranked}
    flag_rows = [(f, by_head.get((f.layer, f.head), {})) for f in v.flags]
    corr = {(c.statistic, c.effect): c for c in v.correlations}
    stats = list(dict.fromkeys(c.statistic for c in v.correlations))
    return flag_rows, [(s, corr.get((s, "delta_loss")), corr.get((s, "delta_accuracy"))) for s in stats]


TOP = 10  # heads in the table of those whose removal hurts most


def top_table(v: HeadsView) -> Section:
    """The TOP heads whose removal hurts most, a column per declared head field of REPORT_TABLE and per
    statistic the registry shows in the report's tables; an interval as "low … high"."""
    fields = by_key()
    keys = [k for k in REPORT_TABLE if k not in REPORT_TABLE_MEASURED or any(h.get(k) is not None for h in v.ranked)]
    columns = [Field("head", "head", "s")]
    columns += [Field(k, fields[k].label, "s") if fields[k] in INTERVALS else fields[k] for k in keys]
    stats = [Field(f"attention.{s.name}", s.column, s.fmt) for s in shown("table")]
    rows = []
    for h in v.ranked[:TOP]:
        row: dict[str, Any] = {"head": head_label(h["layer"], h["head"])}
        for k in keys:
            value = h.get(k)
            if fields[k] in INTERVALS:
                lo, hi = value if isinstance(value, list) else (None, None)
                value = f"{fields[k].format(lo)} … {fields[k].format(hi)}"
            row[k] = value
        if v.verdicts is not None:
            row["verdict"] = str(v.verdicts[h["layer"], h["head"]])  # older files' verdicts too (heads_view)
        attention = h.get("attention") or {}
        row.update({c.key: attention.get(c.key.split(".", 1)[1]) for c in stats})
        rows.append(row)
    return Section("top-heads", "Heads whose removal hurts most", (*columns, *stats), rows)


def _heads_blob(v: HeadsView) -> dict[str, Any]:
    flagged = [{"layer": f.layer, "head": f.head, "label": head_label(f.layer, f.head), "kind": f.kind,
                "reason": f.reason} for f in v.flags]
    seen = {(f.layer, f.head) for f in v.flags}
    top = [{"layer": h["layer"], "head": h["head"], "label": head_label(h["layer"], h["head"])}
           for h in v.ranked if (h["layer"], h["head"]) not in seen]
    return {"name": v.name, "n_layers": v.n_layers, "n_heads": v.n_heads, "flagged": flagged,
            "top": top[:8], "examples": v.examples}


class ReportNote(UserWarning):
    """Something the report left out, said once on stderr by the CLI."""


def _training(report: Report, views: list[TrainingView]) -> None:
    """One step axis for every training panel of every run; several runs are overlaid in one
    comparison figure (their own sections then keep what cannot be overlaid: per-layer maps)."""
    if not views:
        return
    xlim = (min(v.xlim[0] for v in views), max(v.xlim[1] for v in views))
    several = len(views) > 1
    for i, v in enumerate(views):
        v.xlim = xlim
        v.color = plots_training.RUN_COLORS[i % len(plots_training.RUN_COLORS)]
        v.prefix = f"{i + 1}." if several else ""
        report.verdicts.append(training_verdict(v))
    if several:
        report.compare = CompareSection(plots_training.compare(views), views)
    for v in views:
        images = [] if several else [("Loss (eval loss as dots) and learning rate", plots_training.loss_lr(v))]
        images += [("Gradient norms: global (pre-clip) and per layer", plots_training.grad_norms(v)),
                   ("Evaluation metrics", plots_training.eval_metrics(v))]
        if not several:
            images.append(("Throughput", plots_training.throughput(v)))
        images += [("Activations through depth over time", plots_training.depth_over_time(v)),
                   ("Attention entropy per head over time (0 to the uniform entropy log T)",
                    plots_training.entropy(v))]
        images += [(f"{label} through depth over time", plots_training.depth_map(v, label, m))
                   for label, m in v.depth_maps]
        images += [(f"{m.label} per head over time", plots_training.head_map(v, m)) for m in v.head_maps]
        images += [(f"{label} over time", plots_training.curve(v, label, line)) for label, line in v.curves]
        if v.heads_over is not None:  # the monitor's per-head importance and head events
            images += [("Importance of every head over training (|dL/dgate|), one map per attention layer",
                        plots_heads_training.importance_maps(v, v.heads_over)),
                       ("Loss with the head events marked at their steps; the importance of the heads that "
                        "matter at the end", plots_heads_training.loss_and_heads(v, v.heads_over))]
        report.training.append(TrainingSection(v, [(c, img) for c, img in images if img]))


def build_report(sources: Sources, title: str | None = None) -> Report:
    """Views, verdicts and pictures for every source, in the order given within each kind."""
    names = [s.name for s in (*sources.heads, *sources.runs, *sources.checks, *sources.lessons, *sources.prune,
                                *sources.circuit, *sources.checkpoints)]
    report = Report(title or "diagnose report", names)
    budget = MAP_BYTE_BUDGET // max(1, len(sources.heads))
    for src in sources.heads:
        v = heads_view(src.name, src.data, budget)
        report.verdicts.append(heads_verdict(v))
        report.heads.append(HeadsSection(v, plots_heads.head_grids(v), plots_heads.attention_grids(v),
                                         plots_heads.scatter(v), top_table(v), *_tables(v),
                                         per_layer=plots_heads.is_image(v), sections=src.sections))
    _training(report, [training_view(src.name, src.run) for src in sources.runs])
    for src in sources.checks:
        findings = [_finding(f) for f in src.data.get("findings", [])]
        skipped = [(str(x.get("check", "")), str(x.get("why") or x.get("reason") or ""))
                   for x in src.data.get("skipped") or [] if isinstance(x, dict)]
        report.checks.append(ChecksSection(src.name, findings, [str(p) for p in src.data.get("passed") or []],
                                           skipped))
    if sources.checks:
        report.verdicts.append(checks_verdict([(s.name, s.data.get("findings", [])) for s in sources.checks]))
    for src in sources.lessons:
        report.lessons.append(LessonsSection(src.name, [_lesson(x) for x in src.data["lessons"]]))
        report.verdicts.append(lessons_verdict(src.data["lessons"]))
    for src in sources.prune:
        section = prune_section(src.name, src.data)
        report.prune.append(section)
        report.verdicts.append(Verdict(f"Pruning: {src.name}", prune_verdict_lines(section)))
    for i, src in enumerate(sources.circuit, 1):
        report.circuit.append(circuit_section(src.name, src.data, src.sections, i))
    for hs in report.heads:  # a head of a circuit links to it
        v = hs.view
        hs.circuit, hs.circuit_links = links_for(v.name, v.family, v.n_layers, v.n_heads, report.circuit)
    for src in sources.checkpoints:
        cs = CheckpointsSection(src.name, src.data)
        report.checkpoints.append(cs)
        report.verdicts.append(Verdict(f"Heads across checkpoints: {src.name}", checkpoints_verdict_lines(cs)))
    report.blob = {"heads": [_heads_blob(s.view) for s in report.heads]}
    return report
