"""The head-ablation lesson: what the attention map suggests against what removing the head does.

On one trained model, diagnose ablates every head and sets two side by side: (a) the head that
carries most of the task (the largest significant loss increase when removed) and (b) the head
that puts the most weight on the first token among those whose removal changes nothing
significant. Then it closes both together, to tell an idle head from a backup: if removing b
after a costs more than nothing, b was covering for a. The claim is written from the numbers
of the run, so it says what this run found, whatever the seed.
"""

from __future__ import annotations

from typing import Any

import torch

from .ablation import HeadEffect, HeadsResult, ablate_heads, ablate_together
from .ablation.contrast import TINY_ACCURACY

TITLE = "Attention map vs ablation"


def name(h: HeadEffect) -> str:
    return f"L{h.layer}H{h.head}"


def pick(result: HeadsResult) -> tuple[HeadEffect | None, HeadEffect | None]:
    """(a) the significant head with the largest delta loss, (b) the non-significant head with the
    most weight on the first token; either is None when no head qualifies."""
    vital = [h for h in result.heads if h.significant and h.delta_loss is not None]
    inert = [h for h in result.heads if h.verified and not h.significant
             and h.attention.get("first_token") is not None]
    a = max(vital, key=lambda h: h.delta_loss, default=None)
    b = max(inert, key=lambda h: h.attention["first_token"], default=None)
    return a, b


def measure(model: torch.nn.Module, data: dict[str, torch.Tensor], task: str) -> dict[str, Any]:
    """The lesson's rows, column labels and claim for one model on its eval data."""
    result = ablate_heads(model, data, task=task, progress=False)
    a, b = pick(result)
    if a is None or b is None:
        missing = "no head has a significant effect" if a is None else "every head has a significant effect"
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
        row("p (Holm-corrected)", a.p_value_adjusted, b.p_value_adjusted, ".2g"),
        row("Δ accuracy, removed after the other head", after_other["a"], after_other["b"], "+.3f"),
        row("diagnose flag", flags.get((a.layer, a.head), "none"), flags.get((b.layer, b.head), "none"), "s"),
    ]
    return {"a": f"{name(a)}, carries the task", "b": f"{name(b)}, first-token head", "rows": rows,
            "claim": claim(a, b, after_other["b"], result.baseline["accuracy"])}


def claim(a: HeadEffect, b: HeadEffect, b_after_a: float, baseline_accuracy: float) -> str:
    first_b, first_a = b.attention["first_token"], a.attention["first_token"]
    text = (f"{name(b)} puts {first_b:.0%} of its attention on the first token, the most of any head whose "
            f"removal changes nothing significant: accuracy moves {b.delta_accuracy * 100:+.1f} points "
            f"(p = {b.p_value:.2g}). {name(a)} ({first_a:.0%} on the first token) carries the task: "
            f"removing it moves accuracy {a.delta_accuracy * 100:+.1f} points from {baseline_accuracy:.1%}. ")
    if abs(b_after_a) < TINY_ACCURACY:
        text += f"With {name(a)} gone, removing {name(b)} too changes nothing more: it is not {name(a)}'s backup."
    else:
        text += (f"With {name(a)} gone, removing {name(b)} too moves accuracy {b_after_a * 100:+.1f} points: "
                 f"it was a backup that single-head ablation cannot see.")
    max_a, max_b = a.attention.get("max_weight"), b.attention.get("max_weight")
    if max_a is not None and max_b is not None and max_b >= max_a - 0.05:
        text += (f" Judged by its map, {name(b)} looks at least as decisive as {name(a)} (mean max weight "
                 f"{max_b:.2f} against {max_a:.2f}); only ablation tells them apart.")
    return text
