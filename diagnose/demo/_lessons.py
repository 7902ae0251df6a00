"""The Transformer lessons, measured: pairs of reference models that differ in one switch,
trained under TrainingMonitor and examined with diagnose's own checks, so that each claim of
the textbooks comes with a number from a run (the demo's `lessons.json`, `diagnose.lessons/1`).
"""

from __future__ import annotations

import math
from collections import Counter
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .. import _json
from .._write import atomic_write
from ..checks import check_model
from ..monitor import TrainingMonitor, read_run
from ..zoo import ModelConfig, TaskData, TrainConfig, Transformer, induction, order, padded_majority, train
from ..zoo.train import evaluate
from . import _head_lesson as head_lesson
from . import _induction_lesson as induction_lesson
from . import _shipped

SCHEMA = "diagnose.lessons/1"


@dataclass(frozen=True)
class Variant:
    """One trained model of a lesson: a name (its run folder), the task and both configs."""

    name: str
    task: str  # key of TASK_DATA
    model: ModelConfig
    train: TrainConfig


@dataclass
class Trained:
    variant: Variant
    model: Transformer
    eval_data: TaskData
    run_dir: Path
    accuracy: float
    loss: float
    measured: dict[str, Any] | None = None  # _run_rows' result: a run is read once, however many lessons use it
    # the demo's own head sweep and circuit of this model on eval_data (run_demo's step 2), which the
    # lessons on a shipped model take instead of computing the same again
    sweep: Any = None
    circuit: Any = None


@dataclass
class Lesson:
    key: str
    title: str
    claim: str
    a: str  # variant names: a is the textbook choice, b the one it warns against
    b: str
    # rows, or a dict with "rows" and any of "a", "b", "claim" written from the run's numbers
    measure: Callable[[Trained, Trained], list[dict[str, Any]] | dict[str, Any]]


@dataclass
class LessonResult:
    key: str
    title: str
    claim: str
    a: str
    b: str
    rows: list[dict[str, Any]] = field(default_factory=list)  # {metric, a, b, fmt}
    runs: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title, "claim": self.claim, "a": self.a, "b": self.b,
                "rows": self.rows, "runs": self.runs}


def task_data(name: str) -> TaskData:
    """The synthetic data sets the lessons train on (deterministic)."""
    return {
        "induction": lambda: induction(n=3072, length=24, vocab_size=24),
        # a fixed period: copying by position is enough, so what is measured is the optimisation alone
        "copy": lambda: induction(n=3072, length=24, vocab_size=24, min_period=12, max_period=12),
        "order": lambda: order(n=3072, length=8, vocab_size=16),
        "padding": lambda: padded_majority(n=3072, max_len=16, vocab_size=8),
    }[name]()


def variants(quick: bool = False) -> dict[str, Variant]:
    """Every model the lessons train, by name. quick: far fewer steps (tests)."""
    k = 0.25 if quick else 1.0

    def steps(n: int) -> int:
        return max(20, int(n * k))

    ind = ModelConfig(kind="lm", vocab_size=24, max_len=32, n_layers=2, n_heads=4, d_model=64)
    cls_order = ModelConfig(kind="classifier", vocab_size=16, max_len=8, n_layers=2, n_heads=4, d_model=64)
    cls_pad = ModelConfig(kind="classifier", vocab_size=8, max_len=16, n_layers=2, n_heads=4, d_model=64)
    deep_post = replace(ind, n_layers=4, norm="post")
    hot = TrainConfig(steps=steps(300), lr=1e-2, warmup=50, clip=None)  # high lr, no clipping: warmup alone
    wide = replace(ind, n_heads=2, d_model=256)  # d_k = 128: unscaled dot products are large
    deep = replace(ind, n_layers=6)
    base = TrainConfig(steps=steps(300), lr=3e-3, warmup=50)
    vs = [
        Variant("warmup-post-ln", "copy", deep_post, hot),
        Variant("no-warmup-post-ln", "copy", deep_post, replace(hot, warmup=0)),
        Variant("no-warmup-pre-ln", "copy", replace(deep_post, norm="pre"), replace(hot, warmup=0)),
        Variant("scaled", "induction", wide, base),
        Variant("unscaled", "induction", replace(wide, attn_scale="none"), base),
        Variant("positions", "order", cls_order, base),
        Variant("no-positions", "order", replace(cls_order, positions="none"), base),
        Variant("residual-deep", "induction", deep, base),
        Variant("no-residual-deep", "induction", replace(deep, residual=False), base),
        Variant("mask-large-negative", "padding", cls_pad, base),
        Variant("mask-fill-zero", "padding", replace(cls_pad, mask_fill="zero"), base),
    ]
    return {v.name: v for v in vs}


def _split(v: Variant, data_cache: dict[str, TaskData]) -> tuple[TaskData, TaskData]:
    """The variant's task data as (train, eval): the last 512 examples are held out."""
    if v.task not in data_cache:
        data_cache[v.task] = task_data(v.task)
    return data_cache[v.task].split(len(data_cache[v.task]) - 512)


def train_variant(v: Variant, runs_dir: Path, data_cache: dict[str, TaskData]) -> Trained:
    """Train one variant under TrainingMonitor into runs_dir/<name>."""
    tr, ev = _split(v, data_cache)
    torch.manual_seed(v.train.seed)
    model = Transformer(v.model)
    run_dir = runs_dir / v.name
    shutil.rmtree(run_dir, ignore_errors=True)  # the demo owns its folders: a rerun starts afresh
    with TrainingMonitor(model, run_dir, every=1, attention_every=10, clip=v.train.clip, echo=False) as mon:
        res = train(model, tr, v.train, eval_data=ev,
                    on_backward=lambda step, loss, opt: mon.step(loss, optimizer=opt))
    return Trained(v, model, ev, run_dir, res.eval_accuracy, res.eval_loss)


def shipped_variant(v: Variant, runs_dir: Path, data_cache: dict[str, TaskData]) -> Trained:
    """The shipped model trained from v (hash-checked, see _shipped), with the run recorded while it
    trained laid into runs_dir/<name>; accuracy and loss measured here, on this machine."""
    _, ev = _split(v, data_cache)
    model, entry = _shipped.load(v, ev)
    run_dir = _shipped.copy_run(_shipped.MODELS_DIR / entry["run"], runs_dir / v.name)
    loss, accuracy = evaluate(model, ev)
    return Trained(v, model, ev, run_dir, accuracy, loss)


# -- what each lesson measures ---------------------------------------------------------------

def _run_rows(t: Trained) -> dict[str, Any]:
    """What the lessons read off a trained variant's run folder (a copy; read once per run)."""
    if t.measured is None:
        t.measured = _measure_run(t)
    return dict(t.measured)


def _measure_run(t: Trained) -> dict[str, Any]:
    run = read_run(t.run_dir)
    steps = run.steps
    early = steps[steps["step"] < 60]
    att = run.attention
    last_att = att[att["step"] == att["step"].max()] if len(att) else att
    blocks = run.layers
    last = steps.iloc[-1]
    return {
        "accuracy": t.accuracy,
        "loss": t.loss,
        "max_grad_norm_first_60": float(early["grad_norm"].max()),
        "final_grad_norm": float(last["grad_norm"]),
        "entropy": float(last_att["entropy"].mean()) if len(last_att) else math.nan,
        "max_weight": float(last_att["max_weight"].mean()) if len(last_att) else math.nan,
        "token_cos_last_block": float(last[f"layers/{blocks[-1]}/token_cos"]),
        "grad_norm_first_block": float(steps[f"layers/{blocks[0]}/grad_norm"].median()),
        "grad_norm_last_block": float(steps[f"layers/{blocks[-1]}/grad_norm"].median()),
        "alert_counts": dict(Counter(a["kind"] for a in run.alerts)),
    }


# What a stalled or collapsed run raises: the lessons' evidence. Other alerts of these runs (a gradient
# spike at lr 1e-2 without clipping, one-hot attention on the fixed-period task) come and go with the
# CPU's rounding late in a healthy run, so the lessons count them instead of naming them; every alert
# stays in the run folder and the report.
FAILURE_ALERTS = ("no_warmup", "vanishing_grad", "rank_collapse")


def _alert_rows(t: Trained) -> dict[str, Any]:
    counts = _run_rows(t)["alert_counts"]
    return {"alerts": ", ".join(k for k in FAILURE_ALERTS if k in counts) or "none",
            "other_alerts": sum(n for k, n in counts.items() if k not in FAILURE_ALERTS)}


ALERTS = [("alerts", f"monitor alerts ({', '.join(FAILURE_ALERTS)})", "s"),
          ("other_alerts", "other monitor alerts (spikes, entropy), count", "d")]


def _rows(a: Trained, b: Trained, metrics: list[tuple[str, str, str]], extra: dict | None = None) -> list[dict]:
    ra, rb = _run_rows(a), _run_rows(b)
    if any(key in ("alerts", "other_alerts") for key, _, _ in metrics):
        ra.update(_alert_rows(a))
        rb.update(_alert_rows(b))
    ra.update((extra or {}).get("a", {}))
    rb.update((extra or {}).get("b", {}))
    return [{"metric": label, "a": ra[key], "b": rb[key], "fmt": fmt} for key, label, fmt in metrics]


def _check(t: Trained, name: str) -> dict[str, Any]:
    """Problems found by one diagnose check on the trained model, on its own eval data."""
    findings = check_model(t.model, t.eval_data.tensors(), checks=[name])
    problems = [f for f in findings if f.is_problem]
    return {f"check_{name}": "; ".join(f.title for f in problems) if problems else "passes"}


TRAINING = [("accuracy", "eval accuracy", ".3f"), ("loss", "eval loss", ".3f"),
            ("max_grad_norm_first_60", "max grad norm, steps 0-59", ".2f"), *ALERTS]

def heads_lesson(a: Trained) -> dict[str, Any]:
    """The attention-map lesson, on the shipped order model: the same weights on every machine, so
    the same heads are vital and inert whatever the CPU rounds (see _shipped)."""
    return head_lesson.measure(a.model, a.eval_data.tensors(), a.eval_data.task, sweep=a.sweep)


LESSONS = [
    Lesson("warmup", "Learning-rate warmup", "Post-LN at a high lr needs warmup; without it training stalls.",
           "warmup-post-ln", "no-warmup-post-ln", lambda a, b: _rows(a, b, TRAINING)),
    Lesson("pre-ln", "Pre-LN vs Post-LN", "Pre-LN trains at the same high lr without warmup; Post-LN does not.",
           "no-warmup-pre-ln", "no-warmup-post-ln",
           lambda a, b: _rows(a, b, TRAINING + [("token_cos_last_block", "token cosine, last block", ".3f")])),
    Lesson("scaling", "1/sqrt(d_k) scaling", "Without it, dot products grow with d_k and softmax saturates.",
           "scaled", "unscaled",
           lambda a, b: _rows(a, b, [("entropy", "attention entropy (nats), last sample", ".3f"),
                                     ("max_weight", "mean max attention weight", ".3f"),
                                     ("check_scaling", "diagnose check: scaling", "s"),
                                     ("accuracy", "eval accuracy", ".3f")],
                              {"a": _check(a, "scaling"), "b": _check(b, "scaling")})),
    Lesson("positions", "Positional information", "Without positions, attention is permutation-invariant: "
           "a task that depends on order is at chance.", "positions", "no-positions",
           lambda a, b: _rows(a, b, [("accuracy", "eval accuracy (order task)", ".3f"),
                                     ("check_positions", "diagnose check: positions", "s")],
                              {"a": _check(a, "positions"), "b": _check(b, "positions")})),
    Lesson("residual", "Residual connections", "A deep stack without residuals collapses token "
           "representations onto one direction (rank collapse) and stops learning.",
           "residual-deep", "no-residual-deep",
           lambda a, b: _rows(a, b, [("token_cos_last_block", "token cosine, last block", ".3f"),
                                     ("grad_norm_first_block", "median grad norm, first block", ".3g"),
                                     ("grad_norm_last_block", "median grad norm, last block", ".3g"),
                                     ("accuracy", "eval accuracy", ".3f"), *ALERTS])),
    Lesson("mask", "Mask fill value", "Masked scores filled with 0 instead of a large negative number "
           "still get weight: padding leaks into the answer.", "mask-large-negative", "mask-fill-zero",
           lambda a, b: _rows(a, b, [("check_padding", "diagnose check: padding", "s"),
                                     ("accuracy", "eval accuracy", ".3f")],
                              {"a": _check(a, "padding"), "b": _check(b, "padding")})),
    Lesson("heads", head_lesson.TITLE, "A head that puts its weight on the first token may do nothing at all; "
           "only removing heads shows which carry the task.", "order", "order",
           lambda a, _: heads_lesson(a)),
    Lesson("induction", induction_lesson.TITLE, induction_lesson.CLAIM, "induction", "induction",
           lambda a, _: induction_lesson.measure(a.model, a.eval_data.tensors(), a.eval_data.task, a.run_dir,
                                                 sweep=a.sweep, circuit=a.circuit)),
]


def run_lessons(out_dir: str | Path, *, quick: bool = False, only: Sequence[str] | None = None,
                log: Callable[[str], None] = print, trained: dict[str, Trained] | None = None) -> Path:
    """Train the variants, measure the lessons (all, or the keys in `only`), write
    out_dir/lessons.json; returns its path. trained: variants already trained (by name), reused."""
    out = Path(out_dir)
    runs_dir = out / "runs"
    lessons = [les for les in LESSONS if only is None or les.key in only]
    from ._run import demo_variants

    vs = variants(quick)
    shipped = {v.name: v for v in demo_variants()}
    needed = list(dict.fromkeys(name for les in lessons for name in (les.a, les.b)))
    cache: dict[str, TaskData] = {}
    trained = dict(trained or {})
    for name in needed:
        if name in trained:
            log(f"  reused  {name:22s} accuracy {trained[name].accuracy:.3f} ({trained[name].run_dir.name})")
        elif name in vs:
            trained[name] = t = train_variant(vs[name], runs_dir, cache)
            log(f"  trained {name:22s} accuracy {t.accuracy:.3f}")
        else:
            trained[name] = t = shipped_variant(shipped[name], runs_dir, cache)
            log(f"  shipped {name:22s} accuracy {t.accuracy:.3f}")
    results = []
    for lesson in lessons:
        a, b = trained[lesson.a], trained[lesson.b]
        measured = lesson.measure(a, b)
        if not isinstance(measured, dict):
            measured = {"rows": measured}
        runs = list(dict.fromkeys([str(a.run_dir), str(b.run_dir)]))  # a lesson on one model has one run
        res = LessonResult(lesson.key, lesson.title, measured.get("claim", lesson.claim),
                           measured.get("a", lesson.a), measured.get("b", lesson.b), measured["rows"], runs)
        results.append(res)
    out.mkdir(parents=True, exist_ok=True)  # nothing may have been trained here (all reused)
    path = out / "lessons.json"
    return atomic_write(path, _json.dumps({"schema": SCHEMA, "lessons": [r.to_json() for r in results]}, indent=1),
                        what="lessons JSON")


def markdown_table(lessons_json: dict[str, Any]) -> str:
    """The README table: one row per measured metric, textbook choice (a) against the other (b)."""
    lines = ["| lesson | measure | (a) | (b) |", "| --- | --- | --- | --- |"]
    for les in lessons_json["lessons"]:
        for i, row in enumerate(les["rows"]):
            fmt = row["fmt"]
            cells = [format(v, fmt) if fmt != "s" and isinstance(v, (int, float)) else str(v)
                     for v in (row["a"], row["b"])]
            title = f"{les['title']} (a: {les['a']}, b: {les['b']})" if i == 0 else ""
            lines.append(f"| {title} | {row['metric']} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)
