"""`diagnose demo`: everything diagnose does, on models trained by diagnose itself.

1. loads the reference models trained on the three synthetic tasks (shipped in the package, see
   _shipped: the same weights on every machine) with the TrainingMonitor run recorded while each
   trained, and saves each checkpoint with its evaluation data (out/<task>/model.pt, eval.pt,
   runs/<task>);
2. ablates every head of each (out/<task>/heads.json) and checks its wiring (checks.json); finds the
   induction model's circuit (out/induction/circuit.json, on CIRCUIT_EXAMPLES of its examples);
3. trains the lesson pairs (diagnose.demo._lessons) and measures what each switch does (lessons.json);
4. writes one self-contained report of all of it (out/report.html).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from .. import _json
from .._write import atomic_write
from ..ablation import ablate_heads
from ..circuit import find_circuit
from ..checks import check_model
from ..io import save_checkpoint, save_tensors
from ..zoo import ModelConfig, TaskData, TrainConfig
from . import _shipped
from ._lessons import Trained, Variant, markdown_table, run_lessons, shipped_variant, variants


@dataclass
class DemoModel:
    name: str
    task: str
    checkpoint: Path
    data: Path
    heads: Path
    checks: Path
    run_dir: Path
    accuracy: float
    loss: float
    seconds: float
    circuit: Path | None = None  # its circuit (diagnose.circuit/1), for the models whose circuit the demo finds


@dataclass
class DemoResult:
    out_dir: Path
    models: list[DemoModel] = field(default_factory=list)
    lessons: Path | None = None
    report: Path | None = None
    seconds: float = 0.0


def demo_variants() -> list[Variant]:
    """The recipes of the three main demo models, one per synthetic task (shipped trained: _shipped)."""
    return [
        # two heads a layer: enough for the circuit (previous-token head, induction head) and
        # few enough that single-head ablation can see it; with four, copies cover for each other
        Variant("induction", "induction",
                ModelConfig(kind="lm", vocab_size=24, max_len=32, n_layers=2, n_heads=2, d_model=64),
                TrainConfig(steps=600, lr=3e-3, batch_size=64, warmup=50)),
        # the positions lesson's model (a), whose heads the attention-map lesson contrasts: the lessons reuse it
        replace(variants()["positions"], name="order"),
        Variant("padding", "padding",
                ModelConfig(kind="classifier", vocab_size=8, max_len=16, n_layers=2, n_heads=4, d_model=64),
                TrainConfig(steps=400, lr=3e-3, batch_size=64, warmup=50)),
    ]


CIRCUIT_MODELS = ("induction",)  # the demo models whose circuit is found (prev-token head -> induction head)
CIRCUIT_EXAMPLES = 128  # a few seconds on one CPU thread; the intervals stay narrow (the model is confident)


def _write_json(obj: dict, path: Path) -> Path:
    return atomic_write(path, _json.dumps(obj, indent=1), what="demo JSON")


def run_demo(out_dir: str | Path = "demo-out", *, quick: bool = False, lessons: bool | Sequence[str] = True,
             report: bool = True, log: Callable[[str], None] = print) -> DemoResult:
    """Analyse the shipped demo models, train the lesson pairs, report, under out_dir; returns where
    everything is. lessons: all (True), none (False), or those keys only.

    Runs on one CPU thread, so that a rerun gives the same numbers whatever the number of cores.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # float sums then run in one order: the same numbers on any number of cores
    try:
        return _run(Path(out_dir), quick, lessons, report, log)
    finally:
        torch.set_num_threads(threads)


def _run(out: Path, quick: bool, lessons: bool | Sequence[str], report: bool, log: Callable[[str], None]) -> DemoResult:
    from .. import write_report

    start = time.perf_counter()
    result = DemoResult(out)
    cache: dict[str, TaskData] = {}
    log("Loading the demo models (reference Transformer trained on synthetic tasks, shipped: "
        "the same weights on every machine) ...")
    reusable: dict[str, Trained] = {}  # main models the lessons use as they are
    positions = variants(quick)["positions"]
    for v in demo_variants():
        t0 = time.perf_counter()
        t = shipped_variant(v, out / "runs", cache)
        reusable[v.name] = t
        if _shipped.recipe(v) == _shipped.recipe(positions):  # the positions lesson's (a), already trained
            reusable[positions.name] = t
        folder = out / v.name
        data = cache[v.task]
        ckpt = save_checkpoint(t.model, folder / "model.pt",
                               meta={"task": data.task, "dataset": v.task, "description": data.description})
        data_file = save_tensors(t.eval_data.tensors(), folder / "eval.pt")
        t.sweep = heads = ablate_heads(t.model, t.eval_data.tensors(), task=data.task, progress=False)
        heads_file = _write_json(heads.to_json(), folder / "heads.json")
        checks_file = _write_json(check_model(t.model, t.eval_data.tensors()).to_json(), folder / "checks.json")
        circuit = None
        if v.name in CIRCUIT_MODELS:
            few = {k: x[:CIRCUIT_EXAMPLES] for k, x in t.eval_data.tensors().items()}
            t.circuit = find_circuit(t.model, few, task=data.task)  # the induction lesson reads it too
            circuit = t.circuit.save(folder / "circuit.json")
        item = DemoModel(v.name, data.task, ckpt, data_file, heads_file, checks_file, t.run_dir,
                         t.accuracy, t.loss, time.perf_counter() - t0, circuit)
        result.models.append(item)
        log(f"  {v.name:10s} accuracy {item.accuracy:.3f}  loss {item.loss:.3f}  ({item.seconds:.0f} s)")
    if lessons:
        log("Training the lesson pairs (one switch changed per pair) ...")
        result.lessons = run_lessons(out, quick=quick, log=log, trained=reusable,
                                     only=None if lessons is True else list(lessons))
        log(markdown_table(_json.loads(result.lessons.read_text())))
    if report:
        sources = [m.heads for m in result.models] + [m.checks for m in result.models]
        sources += [m.run_dir for m in result.models] + [m.circuit for m in result.models if m.circuit]
        if result.lessons is not None:
            sources.append(result.lessons)
        result.report = write_report(sources, out / "report.html", title="diagnose demo")
    result.seconds = time.perf_counter() - start
    return result
