"""The head-ablation lesson: what the attention map suggests against what removing the head does.

On one trained model, diagnose ablates every head and sets two side by side: (b) the head that
puts the most weight on the first token among those whose removal is negligible (both 95 %
intervals inside the negligible band: shown to be small, not merely not shown to be large),
and (a) the head that puts the most weight on the first token among those whose removal
matters (significant and outside the band: ablation/verdict.py): two maps that read alike, two opposite effects. Then it closes both together,
to tell an idle head from a backup: if removing b after a costs more than nothing, b was
covering for a. The claim is written from the run's numbers, so it says what this run found,
whatever the seed.
"""

from __future__ import annotations

from typing import Any

import torch

from .._head_label import head_label
from ..ablation import HeadEffect, HeadsResult, ablate_heads, ablate_together
from ..ablation.contrast import TINY_ACCURACY
from ..ablation.verdict import MATTERS

TITLE = "Attention map vs ablation"


# a striking map whose removal is negligible: inert, or compensated (its direct effect matters)
STRIKING_NEGLIGIBLE = ("striking_but_inert", "striking_but_compensated")


def name(h: HeadEffect) -> str:
    return head_label(h.layer, h.head)


def pick(result: HeadsResult) -> tuple[HeadEffect | None, HeadEffect | None]:
    """(a) among the heads whose verdict is "matters", and (b) among the negligible
    ones (those flagged striking_but_inert or striking_but_compensated first), the head with the most weight on the first token
    (ties: the larger delta loss); None where no head qualifies."""
    known = [h for h in result.heads if h.verified and h.attention.get("first_token") is not None]

    def most_first(heads: list[HeadEffect]) -> HeadEffect | None:
        return max(heads, key=lambda h: (h.attention["first_token"], h.delta_loss), default=None)

    flagged = {(f["layer"], f["head"]) for f in result.flags if f["kind"] in STRIKING_NEGLIGIBLE}
    inert = [h for h in known if h.negligible]
    return (most_first([h for h in known if h.verdict == MATTERS]),
            most_first([h for h in inert if (h.layer, h.head) in flagged]) or most_first(inert))


def measure(model: torch.nn.Module, data: dict[str, torch.Tensor], task: str,
            sweep: HeadsResult | None = None) -> dict[str, Any]:
    """The lesson's rows, column labels and claim for one model on its eval data. sweep: ablate_heads'
    result on that model and data, where the caller has it already (the demo's own sweep), or None."""
    result = sweep if sweep is not None else ablate_heads(model, data, task=task, progress=False)
    a, b = pick(result)
    if a is None or b is None:
        missing = "no head matters" if a is None else "no head's effect is shown to be negligible"
        return {"a": "-", "b": "-", "rows": [], "claim": f"Nothing to contrast in this run: {missing}."}
    both = ablate_together(model, data, [(a.layer, a.head), (b.layer, b.head)], task=task)
    flags = {(f["layer"], f["head"]): f["kind"] for f in result.flags}
    after_other = {"a": both.delta_accuracy - b.delta_accuracy, "b": both.delta_accuracy - a.delta_accuracy}

    def row(metric: str, va: Any, vb: Any, fmt: str) -> dict[str, Any]:
        return {"metric": metric, "a": va, "b": vb, "fmt": fmt}

    att = [("first_token", "attention weight on the first token"), ("max_weight", "mean max attention weight"),
           ("entropy", "attention entropy (nats)")]
    rows = [row(label, a.attention.get(k), b.attention.get(k), ".2f") for k, label in att]
    rows += [
        row("Δ accuracy, head removed", a.delta_accuracy, b.delta_accuracy, "+.3f"),
        row("Δ loss, head removed", a.delta_loss, b.delta_loss, "+.3f"),
        row("p, Δ loss test (Holm-corrected)", a.p_value_loss_adjusted, b.p_value_loss_adjusted, ".2g"),
        row("Δ accuracy, removed after the other head", after_other["a"], after_other["b"], "+.3f"),
        row("diagnose flag", flags.get((a.layer, a.head), "none"), flags.get((b.layer, b.head), "none"), "s"),
    ]
    top = max(result.heads, key=lambda h: h.delta_loss if h.verified else float("-inf"))
    return {"a": f"{name(a)}, matters", "b": f"{name(b)}, does nothing alone", "rows": rows,
            "claim": claim(a, b, top, after_other["b"], result.baseline["accuracy"]),
            "shows": flags.get((b.layer, b.head)) in STRIKING_NEGLIGIBLE}


def claim(a: HeadEffect, b: HeadEffect, top: HeadEffect, b_after_a: float, baseline_accuracy: float) -> str:
    """The lesson in words, from this run's numbers."""
    text = (f"{name(a)} and {name(b)} both look at the first token ({a.attention['first_token']:.0%} and "
            f"{b.attention['first_token']:.0%} of their attention). Removing {name(a)} moves accuracy "
            f"{a.delta_accuracy * 100:+.1f} points from {baseline_accuracy:.1%}; removing {name(b)} moves it "
            f"{b.delta_accuracy * 100:+.1f} points and loss {b.delta_loss:+.4f}, both shown negligible. ")
    if abs(b_after_a) < TINY_ACCURACY:
        text += f"With {name(a)} gone, removing {name(b)} too changes nothing more: it is not {name(a)}'s backup. "
    elif b_after_a < 0:
        text += (f"With {name(a)} gone, removing {name(b)} too moves accuracy a further {b_after_a * 100:+.1f} "
                 f"points: it backs {name(a)} up, which single-head ablation cannot see. ")
    else:
        text += (f"With {name(a)} gone, removing {name(b)} too gives back {b_after_a * 100:+.1f} points: the two "
                 "interact, which single-head ablation cannot see. ")
    if top is not a:
        text += (f"The head the task needs most, {name(top)} ({top.delta_accuracy * 100:+.1f} points), puts "
                 f"{top.attention.get('first_token') or 0:.0%} of its attention there. ")
    return text + "The maps cannot tell these heads apart; removing them can."
