"""The tables of `diagnose stats RUN --replay STEP` (the data: _replay.Replay.to_dict, also its --json)."""

from __future__ import annotations

import math
from typing import Any

from .._terminal import plain

SHOWN_HEADS = 5


def _v(x: Any, fmt: str = ".4g") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "NaN" if math.isnan(x) else format(x, fmt)
    return plain(x)


def verdict(view: dict[str, Any]) -> str:
    """One line: what drove the spike and what would have kept the loss down."""
    parts = []
    bad = [b["block"] for b in view["blocks"] if b["grad_norm"] is None or not math.isfinite(b["grad_norm"])]
    if bad:
        parts.append(f"the gradient is not finite in {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}")
    elif view["blocks"]:
        b = view["blocks"][0]
        parts.append(f"{b['block']} carries {b['rise_share']:.0%} of the gradient norm's rise ({_v(b['ratio'], '.3g')}x "
                     f"its median)")
    risen = [h for h in view["heads"] if (h["logit_ratio"] or 0) >= 2 or (h["entropy_fall"] or 0) >= 0.5]
    if risen:
        parts.append("heads " + ", ".join(f"{h['site']} #{h['head']}" for h in risen[:3]) + " jumped")
    if view["examples"]:
        parts.append("worst examples " + ", ".join(str(e["index"]) for e in view["examples"][:3]))
    kept = view["kept_down"]
    none = next((c for c in view["cures"] if c["cure"] == "none"), None)
    if none is not None and none["kept_down"]:
        cure = "the run's own update kept the loss down: nothing to cure"
    else:
        cure = "kept the loss down: " + (", ".join(kept) if kept else "none of the cures tried")
    return f"step {view['step']}: " + "; ".join(parts + [cure])


def render_replay(view: dict[str, Any], console) -> None:
    from rich.table import Table
    from rich.text import Text

    r = view["reproduced"]
    console.print(Text(f"replayed step {view['step']} ({', '.join(plain(k) for k in view['kinds'])}): loss "
                       f"{_v(r['loss_replayed'])} (recorded {_v(r['loss_recorded'])}), grad norm "
                       f"{_v(r['grad_norm_replayed'])} (recorded {_v(r['grad_norm_recorded'])}); held out: "
                       f"{plain(view['holdout'])}"))
    for note in view["notes"]:
        console.print(Text(f"note: {plain(note)}"))
    tables = [("blocks: gradient norm against the run's median before", ("block", "grad norm", "before", "ratio",
                                                                         "share", "share of rise"),
               [(b["block"], _v(b["grad_norm"]), _v(b["before"]), _v(b["ratio"], ".3g"), f"{b['share']:.0%}",
                 f"{b['rise_share']:.0%}") for b in view["blocks"]]),
              ("heads, most risen first", ("site", "head", "max logit", "before", "ratio", "entropy", "before"),
               [(h["site"], str(h["head"]), _v(h["max_logit"]), _v(h["max_logit_before"]), _v(h["logit_ratio"], ".3g"),
                 _v(h["entropy"]), _v(h["entropy_before"])) for h in view["heads"][:SHOWN_HEADS]]),
              ("examples, highest loss first", ("example", "loss"),
               [(str(e["index"]), _v(e["loss"])) for e in view["examples"]]),
              (f"cures (loss before the update: {_v(view['before']['same'])} on this batch, "
               f"{_v(view['before']['holdout'])} held out)", ("cure", "loss after (this batch)",
                                                              "loss after (held out)", "kept down", "what"),
               [(c["cure"], _v(c["loss_same"]), _v(c["loss_holdout"]),
                 "-" if c["kept_down"] is None else ("yes" if c["kept_down"] else "no"), c["what"])
                for c in view["cures"]])]
    for title, cols, rows in tables:
        if not rows:
            continue
        t = Table(title=title, title_justify="left")
        for col in cols:
            t.add_column(col)
        for row in rows:
            t.add_row(*(Text(plain(x)) for x in row))
        console.print(t)
    console.print(Text(plain(verdict(view))))
