"""The report's view of `diagnose heads-over`: heads x checkpoints (verdict and Δloss with its interval per cell)
and what changed between consecutive checkpoints, from the `diagnose.heads-over-checkpoints/1` JSON only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagnose.display import head_label
from diagnose.errors import InputFileError
from diagnose.files import kind

from .view_prune import _Fields

CHECKPOINTS_SCHEMA = "diagnose.heads-over-checkpoints/1"
_FIX = "regenerate it with `diagnose heads-over --json`"
_CELL = ("delta_loss", "delta_accuracy", "p_value_loss_adjusted")


@dataclass
class CheckpointsSection:
    name: str
    data: dict[str, Any]  # checked: every number a float or None


class _Checked(_Fields):
    def bad(self, field: str, value: Any, want: str) -> InputFileError:
        return InputFileError(f"{self.where}: `{field}` is {kind(value)}, not {want}; {_FIX}")

    def text(self, value: Any, field: str, optional: bool = False) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise self.bad(field, value, "a string")
        return value

    def pair(self, value: Any, field: str) -> list[float] | None:
        if value is None:
            return None
        if not (isinstance(value, list) and len(value) == 2):
            raise self.bad(field, value, "a [low, high] pair")
        return [self.num(x, f"{field}[{i}]") for i, x in enumerate(value)]

    def cell(self, value: Any, field: str) -> dict[str, Any]:
        c = self.obj(value, field)
        out = {k: self.num(c.get(k), f"{field}.{k}") for k in _CELL}
        out.update(verdict=self.text(c.get("verdict"), f"{field}.verdict", optional=True),
                   delta_loss_ci=self.pair(c.get("delta_loss_ci"), f"{field}.delta_loss_ci"),
                   delta_accuracy_ci=self.pair(c.get("delta_accuracy_ci"), f"{field}.delta_accuracy_ci"))
        return out


def check_checkpoints(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The document with every field the view reads checked; InputFileError naming the field otherwise."""
    f = _Checked(where)
    names = [f.text(x, f"checkpoints[{i}]") for i, x in enumerate(f.rows(data.get("checkpoints"), "checkpoints"))]
    model = f.obj(data.get("model"), "model")
    out = dict(data, checkpoints=names, model={"family": str(model.get("family")),
                                               "n_layers": f.count(model.get("n_layers"), "model.n_layers"),
                                               "n_heads": f.count(model.get("n_heads"), "model.n_heads")})
    out["baselines"] = [{"loss": f.num(f.obj(b, f"baselines[{i}]").get("loss"), f"baselines[{i}].loss")}
                        for i, b in enumerate(f.rows(data.get("baselines"), "baselines"))]
    out["heads"] = []
    for i, h in enumerate(f.rows(data.get("heads"), "heads")):
        h = f.obj(h, f"heads[{i}]")
        cells = f.rows(h.get("cells"), f"heads[{i}].cells")
        if len(cells) != len(names):
            raise InputFileError(f"{where}: `heads[{i}].cells` has {len(cells)} cells for {len(names)} checkpoints; "
                                 f"{_FIX}")
        out["heads"].append({"layer": f.count(h.get("layer"), f"heads[{i}].layer", False),
                             "head": f.count(h.get("head"), f"heads[{i}].head", False),
                             "cells": [f.cell(c, f"heads[{i}].cells[{j}]") for j, c in enumerate(cells)]})
    out["changes"] = []
    for i, c in enumerate(f.rows(data.get("changes"), "changes")):
        c = f.obj(c, f"changes[{i}]")
        out["changes"].append({"layer": f.count(c.get("layer"), f"changes[{i}].layer", False),
                               "head": f.count(c.get("head"), f"changes[{i}].head", False),
                               **{k: f.text(c.get(k), f"changes[{i}].{k}")
                                  for k in ("kind", "from_checkpoint", "to_checkpoint")},
                               "before": f.cell(c.get("before"), f"changes[{i}].before"),
                               "after": f.cell(c.get("after"), f"changes[{i}].after")})
    return out


def checkpoints_verdict_lines(s: CheckpointsSection) -> list[tuple[str, str]]:
    """The summary's lines: how many heads changed, and which stopped mattering or became vital."""
    d = s.data
    lines = [("checkpoints", f"{len(d['checkpoints'])}: {', '.join(d['checkpoints'])}")]
    for kind_ in ("stopped mattering", "became vital"):
        named = [c for c in d["changes"] if c["kind"] == kind_]
        if named:
            lines.append((kind_, "; ".join(f"{head_label(c['layer'], c['head'])} ({c['from_checkpoint']} → "
                                           f"{c['to_checkpoint']})" for c in named)))
    if not d["changes"]:
        lines.append(("what changed", "no head's verdict changed between consecutive checkpoints"))
    return lines
