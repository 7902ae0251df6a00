"""The induction lesson: heads forming during training, seen live by the monitor, then proved at the end.

On the shipped induction model (a random period, so no positional offset leads to the answer: the
task needs a previous-token head read by an induction head, zoo.tasks.induction), three views of
the same heads, side by side:
(a) the monitor while the model trained, from the run recorded with it: the steps at which heads
    became vital and became induction heads, and the induction phase change from the in-context score
    (issue 35), against the step at which the training loss, logged every step, fell halfway (the
    loss is scored only where copying predicts the next token, so its fall is the phase change);
(b) the exact checks on the final model: the head sweep (which heads matter, alone and together) and
    the circuit (path patching of every edge: which head the induction head reads, and through what).
The run and the weights are shipped (_shipped), so every machine reads the same events; the sweep and
the circuit run here, on weights whose verdicts rounding does not move. The claim is written from
the run file and the verdicts only (no float that rounding moves), so it is the same on every CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .._head_label import head_label
from ..ablation import ablate_heads
from ..circuit import find_circuit
from ..monitor import read_run

TITLE = "Induction heads forming"
CLAIM = ("Induction heads form in a phase change: the monitor names the heads and the step while the model "
         "trains; the sweep and the circuit on the final model confirm them.")
CIRCUIT_EXAMPLES = 64  # path patching of the 4-head model's 16 edges on these: about 3 s on one CPU thread


def _events(run, kind: str) -> list[tuple[int, str]]:
    """(step, heads) of each event of `kind`, in step order."""
    return [(int(a["step"]), a["where"]) for a in run.alerts if a["kind"] == kind]


def loss_halfway(loss: list[float]) -> int | None:
    """The first step at which the 5-step mean of the loss has fallen half way from its first value
    to its last 20 steps' mean (the phase change, seen on every step rather than on sampled ones)."""
    if len(loss) < 25:
        return None
    final = sum(loss[-20:]) / 20
    half = loss[0] - (loss[0] - final) / 2
    smooth = [sum(loss[max(0, i - 4):i + 1]) / len(loss[max(0, i - 4):i + 1]) for i in range(len(loss))]
    return next((i for i, v in enumerate(smooth) if v <= half), None)


def _listed(events: list[tuple[int, str]]) -> str:
    return ", ".join(f"{where} (step {step})" for step, where in events) or "none"


def measure(model: torch.nn.Module, data: dict[str, torch.Tensor], task: str, run_dir: Path,
            sweep: Any = None, circuit: Any = None) -> dict[str, Any]:
    """The lesson's rows, column labels and claim for the induction model, its eval data and its run.
    sweep, circuit: ablate_heads' and find_circuit's results on that model and data where the caller has
    them already (the demo's step 2 finds the circuit on more examples), or None: computed here."""
    run = read_run(run_dir)
    phase, induction, vital = (_events(run, k) for k in ("induction_phase_change", "induction_head", "head_vital"))
    halfway = loss_halfway([float(x) for x in run.steps["loss"]])
    if sweep is None:
        sweep = ablate_heads(model, data, task=task, progress=False)
    matters = sorted((h for h in sweep.heads if h.verdict == "matters"), key=lambda h: -h.delta_loss)
    groups = [f for f in sweep.flags if f["kind"] == "redundant_group"]
    if circuit is None:
        circuit = find_circuit(model, {k: v[:CIRCUIT_EXAMPLES] for k, v in data.items()}, task=task)
    # the circuit's largest edge from a head to a head (its edges are ordered by effect; MLP nodes aside)
    edges = [e for e in circuit.edges if e.in_circuit and e.edge.heads_only][:1]
    roles = {(h["layer"], h["head"]): h for h in circuit.heads}

    def row(metric: str, a: Any, b: Any, fmt: str) -> dict[str, Any]:
        return {"metric": metric, "a": a, "b": b, "fmt": fmt}

    named = sorted({h for _, where in induction for h in where.split(", ")})
    rows = [
        row("induction heads: named while training / their verdict on the final model", _listed(induction),
            ", ".join(f"{n}: {_verdict(sweep, n)}" for n in named) or "none", "s"),
        row("heads that matter: became vital while training / the sweep's, largest effect first", _listed(vital),
            ", ".join(head_label(h.layer, h.head) for h in matters) or "none", "s"),
        row("heads that cover for each other (flag redundant_group)", "-",
            "; ".join(", ".join(head_label(*m) for m in f["heads"]) for f in groups) or "none", "s"),
        row("Δ accuracy, that group closed together", "-", groups[0]["together"]["delta_accuracy"] if groups else "-",
            "+.3f"),
        row("phase change: the monitor's step / the loss, logged every step, half way down", _first(phase),
            "-" if halfway is None else halfway, "d"),
        row("circuit: the edge the induction head reads", "-",
            ", ".join(f"{e.edge.label}, {e.edge.composition}-composition" for e in edges) or "none", "s"),
        row("circuit: previous-token share of the head it reads (final model)", "-",
            _share(roles, edges[0].edge.sender) if edges else "-", ".2f"),
        row("circuit: faithfulness (share of the loss gap it keeps)", "-", circuit.circuit.faithfulness, ".2f"),
    ]
    return {"a": "the monitor, while it trained", "b": "exact, on the final model", "rows": rows,
            "claim": claim(phase, induction, named, sweep, edges, roles)}


def _verdict(sweep, label: str) -> str:
    return next((str(h.verdict) for h in sweep.heads if head_label(h.layer, h.head) == label), "not a head")


def _first(events: list[tuple[int, str]]) -> int | str:
    return events[0][0] if events else "-"


def _share(roles: dict, head: tuple[int, int]) -> float | str:
    value = roles.get(head, {}).get("stats", {}).get("prev_token")
    return "-" if value is None else float(value)


ROLE_WORDS = {"prev_token": "previous-token", "induction": "induction", "duplicate_token": "duplicate-token"}


def _role(head: dict[str, Any] | None) -> str | None:
    """A circuit head (circuit.heads' entry) in words: its role where the circuit names one (a share of at
    least circuit.result.NAMED_AT), else its largest naming share, said as such."""
    if head is None:
        return None
    if head.get("role") in ROLE_WORDS:
        word = ROLE_WORDS[head["role"]]
        return f"{'an' if word[0] in 'aeiou' else 'a'} {word} head"
    known = {k: v for k, v in head["stats"].items() if v is not None and k in ROLE_WORDS}
    best = max(known, key=known.get, default=None)
    return None if best is None else f"a head whose largest share is {ROLE_WORDS[best]}"


def claim(phase, induction, named: list[str], sweep, edges, roles: dict) -> str:
    """The lesson in words, from the run's events and the verdicts (no float that rounding moves)."""
    if not phase or not named:
        return f"{CLAIM} In this run the monitor named {'no phase change' if not phase else 'no induction head'}."
    text = (f"While the model trained, the monitor named {', '.join(named)} induction heads (from step "
            f"{induction[0][0]}) and the induction phase change at step {phase[0][0]}. ")
    confirmed = [n for n in named if _verdict(sweep, n) == "matters"]
    text += (f"On the final model the sweep confirms {', '.join(confirmed)} as heads that matter. " if confirmed
             else "On the final model the sweep finds none of them matters alone. ")
    for e in edges:
        reader, read = _role(roles.get(e.edge.receiver)), _role(roles.get(e.edge.sender))
        text += (f"The circuit shows {head_label(*e.edge.receiver)} reading {head_label(*e.edge.sender)} "
                 f"through its {'keys' if e.edge.part == 'k' else e.edge.part} ({e.edge.composition}-composition)")
        text += f": {reader} reads {read}. " if reader and read else ". "
    return text.strip()
