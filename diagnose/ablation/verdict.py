"""One language for significance and size: each head's verdict, read by the CLI table, the JSON, the
report and the method agreement (issue 23).

Significance says an effect is there; the negligible band says whether it is big enough to care about.
A head "matters" only when both hold: its loss test is significant and its effect lies outside the band.
A head that is significant but whose effect lies inside the band is "detectable but negligible" (a large
data set or a near-zero baseline loss finds tiny effects). "negligible": not significant and both 95 %
intervals inside the band (equivalence). Anything else is "undecided": the data cannot tell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from .result import HeadEffect

MATTERS = "matters"
DETECTABLE = "detectable but negligible"
NEGLIGIBLE = "negligible"
UNDECIDED = "undecided"
VERDICTS = (MATTERS, DETECTABLE, NEGLIGIBLE, UNDECIDED)
# what agreement across methods compares: a detectable-but-negligible head is negligible in size
CLASS = {MATTERS: MATTERS, DETECTABLE: NEGLIGIBLE, NEGLIGIBLE: NEGLIGIBLE, UNDECIDED: UNDECIDED}


def classify(significant: bool | None, negligible: bool | None, delta_loss: float | None,
             delta_accuracy: float | None, band: dict[str, float]) -> str:
    """The verdict of one effect (a head's total effect, or its direct effect) from its test and size."""
    if significant:
        inside = delta_loss is not None and abs(delta_loss) < band["loss"] and abs(delta_accuracy or 0.0) < band["accuracy"]
        return DETECTABLE if (negligible or inside) else MATTERS
    return NEGLIGIBLE if negligible else UNDECIDED


def verdict(h: "HeadEffect", band: dict[str, float]) -> str | None:
    """The head's verdict (module docstring); None for a head --fast did not verify."""
    if not h.verified:
        return None
    return classify(h.significant, h.negligible, h.delta_loss, h.delta_accuracy, band)


def count(heads: Sequence["HeadEffect"]) -> dict[str, int]:
    """How many heads have each verdict (every verdict named, 0 included)."""
    out = {v: 0 for v in VERDICTS}
    for h in heads:
        if h.verdict is not None:
            out[h.verdict] += 1
    return out


def agreement(results: dict[str, Any]) -> dict[str, Any]:
    """Per head, each method's verdict and whether they agree (matters / negligible / undecided), from
    {method: HeadsResult}; `depends` lists the heads whose verdict depends on the method, `contradicts` those
    of them that matter under one method and are negligible under another (the others are firm under one
    method and undecided under another: a question of power, not of the method). A head one of the
    methods did not verify (--fast) is left out of the comparison."""
    methods = list(results)
    first = results[methods[0]]
    rows, depends, contradicts = [], [], []
    for h in first.heads:
        per = {m: results[m].head(h.layer, h.head) for m in methods}
        verdicts = {m: e.verdict for m, e in per.items()}
        known = [v for v in verdicts.values() if v is not None]
        agree = None if len(known) < len(methods) else len({CLASS[v] for v in known}) == 1
        rows.append({"layer": h.layer, "head": h.head, "verdicts": verdicts, "agree": agree,
                     "delta_loss": {m: e.delta_loss for m, e in per.items()},
                     "delta_loss_ci": {m: e.delta_loss_ci for m, e in per.items()},
                     "p_value_loss_adjusted": {m: e.p_value_loss_adjusted for m, e in per.items()}})
        if agree is False:
            depends.append([h.layer, h.head])
            if {MATTERS, NEGLIGIBLE} <= {CLASS[v] for v in known}:
                contradicts.append([h.layer, h.head])
    return {"methods": methods, "heads": rows, "depends": depends, "contradicts": contradicts,
            "n_compared": sum(r["agree"] is not None for r in rows), "n_depends": len(depends)}
