"""The attention-map lesson: which two heads it picks, and that its numbers are the engine's. It runs
on the shipped order model (diagnose/demo/models), the same weights on every machine: the verdicts
below must hold on every CPU kernel path and thread count, and CI runs this file on each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnose import ablate_heads, ablate_together
from diagnose.ablation.result import HeadsResult
from diagnose.demo import demo_variants, run_lessons, shipped_variant
from diagnose.ablation.verdict import verdict
from diagnose.demo._head_lesson import measure, name, pick

from .ablation.test_contrast import head

pytestmark = pytest.mark.numerics


def _result(heads):
    return HeadsResult({"n_layers": 1, "n_heads": len(heads)}, "classification", "zero", 10, 10,
                       {"accuracy": 1.0, "loss": 0.1}, heads, {}, [], {}, {})


def test_pick_the_first_token_heads_that_matter_and_that_do_not():
    heads = [head(0, 0, dacc=-0.3, dloss=0.8, p=1e-9, att={"first_token": 0.05}),
             head(0, 1, dacc=-0.1, dloss=0.2, p=1e-4, att={"first_token": 0.9}),  # vital: never (b)
             head(0, 2, dacc=0.0, dloss=0.0, p=0.9, att={"first_token": 0.6}),
             head(0, 3, dacc=0.0, dloss=0.001, p=1.0, att={"first_token": 0.3})]
    band = {"loss": 0.01, "accuracy": 0.02}
    for h in heads:  # what the engine decides from the intervals
        h.negligible = abs(h.delta_loss) < band["loss"]
        h.verdict = verdict(h, band)
    a, b = pick(_result(heads))
    assert (name(a), name(b)) == ("L0.H1", "L0.H2")
    assert pick(_result(heads[2:])) == (None, heads[2])  # nothing carries the task
    assert pick(_result(heads[:2]))[1] is None  # every head matters


@pytest.mark.slow
def test_the_lesson_on_the_demo_order_model(tmp_path: Path, monkeypatch):
    (t,) = [shipped_variant(v, tmp_path, {}) for v in demo_variants() if v.name == "order"]
    data, task = t.eval_data.tensors(), t.eval_data.task
    out = measure(t.model, data, task)
    result = ablate_heads(t.model, data, task=task, progress=False)  # independently of the lesson
    a, b = pick(result)
    assert a is not None and b is not None, "the order model has a head that carries the task"
    assert out["a"].startswith(name(a)) and out["b"].startswith(name(b))
    rows = {r["metric"]: r for r in out["rows"]}
    # measure() runs the same ablate_heads / ablate_together calls on the same model and data:
    # the same operations in the same order, so its numbers are bit-equal to these
    assert rows["Δ accuracy, head removed"]["a"] == a.delta_accuracy
    assert rows["Δ loss, head removed"]["b"] == b.delta_loss
    assert rows["attention weight on the first token"]["b"] == b.attention["first_token"]
    both = ablate_together(t.model, data, [(a.layer, a.head), (b.layer, b.head)], task=task)
    after_a = rows["Δ accuracy, removed after the other head"]["b"]
    assert after_a == both.delta_accuracy - a.delta_accuracy
    # what the lesson is about: (a) matters, (b) does not, and the claim says so in numbers
    assert a.significant and a.delta_accuracy < -0.02 and b.negligible and abs(b.delta_accuracy) < 0.01
    # ... and with margins, so that it shows on any CPU: (b) looks more like (a) than like the model's other heads
    assert b.attention["first_token"] > 0.5 and a.delta_loss > 20 * max(b.delta_loss_ci[1], 1e-4)
    assert f"{b.attention['first_token']:.0%}" in out["claim"] and name(a) in out["claim"]
    # the sweep itself tests the flag's suspicion: (b) closed with the heads that look the same
    flag = next(f for f in result.flags if (f["layer"], f["head"]) == (b.layer, b.head))
    group = [(b.layer, b.head), *(tuple(t) for t in flag["twins"])]
    assert (a.layer, a.head) in group  # here the head that matters is among its look-alikes
    closed = ablate_together(t.model, data, group, task=task)
    assert flag["together"]["delta_accuracy"] == closed.delta_accuracy  # the sweep's own ablate_together call
    assert "closed together with" in flag["reason"] and "may cover" not in flag["reason"]
    backs = rows["Δ accuracy, removed after the other head"]["b"] <= -0.01
    same_pair = flag["twins"] == [[a.layer, a.head]]  # then the flag and the lesson measured the same pair
    assert not same_pair or ("so it backs them up" in flag["reason"]) == backs
    # the demo hands its order model and its own sweep of it to the lessons: reused as they are, neither
    # trained nor swept again (run_demo's step 2 is this same ablate_heads call)
    import diagnose.demo._head_lesson as head_lesson

    t.sweep = result
    monkeypatch.setattr(head_lesson, "ablate_heads", lambda *a, **k: pytest.fail("the handed-over sweep is made again"))
    logs: list[str] = []
    path = run_lessons(tmp_path / "out", only=["heads"], trained={"order": t}, log=logs.append)
    (lesson,) = json.loads(path.read_text())["lessons"]
    assert logs and all(line.lstrip().startswith("reused") for line in logs)
    assert lesson["runs"] == [str(t.run_dir)] and lesson["rows"] == out["rows"] and lesson["claim"] == out["claim"]


def test_the_lesson_loads_the_shipped_model_when_none_is_handed_over(tmp_path: Path):
    logs: list[str] = []
    path = run_lessons(tmp_path, only=["heads"], log=logs.append)
    (lesson,) = json.loads(path.read_text())["lessons"]
    assert [line.split()[:2] for line in logs] == [["shipped", "order"]]
    assert lesson["runs"] == [str(tmp_path / "runs" / "order")] and (tmp_path / "runs" / "order" / "metrics.jsonl").is_file()
    assert "does nothing alone" in lesson["b"] and "on this machine" not in lesson["claim"]
