"""The induction lesson (issue 35): on the shipped induction model (random period, so it needs the two-layer
circuit), the monitor's head events read off the run recorded while it trained, checked against the run's
own files and against the sweep and attention statistics computed here. The weights and the run are
shipped, so the verdicts below hold on every CPU kernel path (CI runs the demo on each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnose import ablate_together, attention_summary
from diagnose.demo import demo_variants, run_lessons, shipped_variant

pytestmark = pytest.mark.numerics


def _label(layer: int, head: int) -> str:
    return f"L{layer}.H{head}"


@pytest.mark.slow
def test_the_monitor_names_the_induction_heads_and_the_exact_checks_confirm_them(tmp_path: Path):
    logs: list[str] = []
    path = run_lessons(tmp_path, only=["induction"], log=logs.append)
    (lesson,) = json.loads(path.read_text())["lessons"]
    assert [line.split()[:2] for line in logs] == [["shipped", "induction"]]  # nothing trained
    run = tmp_path / "runs" / "induction"
    alerts = [json.loads(line) for line in (run / "alerts.jsonl").read_text().splitlines()]
    induction = [a for a in alerts if a["kind"] == "induction_head"]
    (phase,) = [a for a in alerts if a["kind"] == "induction_phase_change"]
    named = sorted({h for a in induction for h in a["where"].split(", ")})
    assert named, "the shipped run names no induction head"

    # the phase change within 10 % of where the training loss (scored only where copying predicts) falls half way
    loss = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    half = (loss[0] + sum(loss[-20:]) / 20) / 2
    smooth = [sum(loss[max(0, i - 4):i + 1]) / len(loss[max(0, i - 4):i + 1]) for i in range(len(loss))]
    drop = next(i for i, v in enumerate(smooth) if v <= half)
    assert abs(phase["step"] - drop) <= 0.1 * drop, (phase["step"], drop)
    step_row = next(r for r in lesson["rows"] if r["metric"].startswith("phase change"))
    assert (step_row["a"], step_row["b"]) == (phase["step"], drop)

    # the exact checks, here: each named head raises the loss when removed, and closed together they take the
    # answer (each copies the same one); the lesson calls each of them a head that matters
    (t,) = [shipped_variant(v, tmp_path / "again", {}) for v in demo_variants() if v.name == "induction"]
    data = t.eval_data.tensors()
    heads = {n: tuple(int(x) for x in n[1:].split(".H")) for n in named}
    alone = {n: ablate_together(t.model, data, [h], task="lm") for n, h in heads.items()}
    assert all(r.delta_loss > 0 for r in alone.values()), {n: r.delta_loss for n, r in alone.items()}
    together = ablate_together(t.model, data, list(heads.values()), task="lm")
    assert together.delta_accuracy < -0.5 and all(r.delta_accuracy > -0.05 for r in alone.values())
    verdicts = next(r for r in lesson["rows"] if r["metric"].startswith("induction heads"))["b"]
    assert verdicts == ", ".join(f"{n}: matters" for n in named)

    # the circuit row: a named induction head reads, through its keys, the layer-0 head with the largest
    # previous-token share; that head matters alone more than any other (the sweep), and the reader's
    # attention is induction (attention statistics computed here)
    edge = next(r for r in lesson["rows"] if r["metric"].startswith("circuit: the edge"))["b"]
    sender, rest = edge.split(" -> ")
    receiver = rest.split(" ")[0]
    assert rest.endswith("(k), K-composition") and receiver in named and sender.startswith("L0.")
    stats = attention_summary(t.model, [{k: v for k, v in data.items() if k != "labels"}], keep=0).stats
    prev0 = stats[0]["prev_token"]
    assert sender == _label(0, max(range(len(prev0)), key=lambda h: prev0[h]))
    reads = ablate_together(t.model, data, [(0, int(sender[-1]))], task="lm")
    assert reads.delta_accuracy < -0.3  # without the head it reads, the induction head has nothing to match
    layer, head = (int(x) for x in receiver[1:].split(".H"))
    assert stats[layer]["induction"][head] > 0.9
    assert f"{receiver} reading {sender} through its keys" in lesson["claim"]
    assert all(n in lesson["claim"] for n in named) and f"step {phase['step']}" in lesson["claim"]
