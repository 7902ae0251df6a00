"""PruneResult's typed parts write exactly the `diagnose.prune/1` JSON the schema has always had;
`.save(path)` writes that JSON through the one policy, `.save_pretrained(folder)` the model."""

from __future__ import annotations

import json

import torch.nn as nn

from diagnose import _json
from diagnose.prune.result import (Candidate, Change, CurvePoint, Figures, ModelInfo, PruneResult, Removal, Settings,
                                   Size, Stop, Timing, Verification)

# the schema's keys, in the order every earlier version wrote them
TOP = ["schema", "model", "task", "method", "budget", "n_examples", "baseline", "n_heads_total", "n_removed",
       "fraction_removed", "curve", "order", "heads_left", "stop", "verify", "data", "eval", "size", "timing",
       "notes", "saved"]


def _result(loss: float = 0.5) -> PruneResult:
    base, after = Figures(1.0, 0.25), Figures(0.75, loss)
    return PruneResult(
        model=nn.Linear(2, 2), info=ModelInfo("reference", "Transformer", 2, [2, 2], None), task="classification",
        method="zero", settings=Settings(1.0, None, 4, None), n_examples=8, baseline=base,
        curve=[CurvePoint(0, 0.0, 1.0, 0.25), CurvePoint(1, 0.25, 0.75, loss, 1, 0)],
        order=[Removal(1, 0, 0.125, 0.75, loss)], heads_left=[2, 1],
        stop=Stop("removing one more head would exceed the budget", Candidate(0, 1, 0.5, 2.0)),
        verify=Verification(0.0, 1.0, 1e-5, True),
        data=Change(base, after, -0.25, [-0.5, 0.0], 0.25, note="chosen here"),
        eval=Change(base, after, -0.25, [-0.5, 0.0], 0.25, n_examples=8),
        size=Size(100, 90, 0.002, 0.001, 2.0, 7, 1, 8), timing=Timing(1.5, 2, 40), notes=["a note"])


def test_the_parts_write_the_schema_s_objects_in_its_order():
    d = _result().to_json()
    assert list(d) == TOP
    assert d["model"] == {"family": "reference", "class": "Transformer", "n_layers": 2, "n_heads": [2, 2],
                          "format": None}
    assert d["budget"] == {"max_drop": 1.0, "max_loss": None, "candidates": 4, "limit": None}
    assert [list(p) for p in d["curve"]] == [["n_removed", "fraction_removed", "accuracy", "loss"],
                                             ["n_removed", "fraction_removed", "accuracy", "loss", "layer", "head"]]
    assert list(d["order"][0]) == ["layer", "head", "estimate", "accuracy", "loss"]
    assert d["stop"] == {"reason": "removing one more head would exceed the budget",
                         "next": {"layer": 0, "head": 1, "accuracy": 0.5, "loss": 2.0}}
    assert list(d["verify"]) == ["max_abs_diff", "output_scale", "tolerance", "passed"]
    assert list(d["data"]) == ["before", "after", "delta_accuracy", "delta_accuracy_ci95", "noise", "note"]
    assert list(d["eval"]) == ["n_examples", "before", "after", "delta_accuracy", "delta_accuracy_ci95", "noise"]
    assert list(d["size"]) == ["parameters_before", "parameters_after", "forward_seconds_before",
                               "forward_seconds_after", "speedup", "repeats", "threads", "batch"]
    assert d["timing"] == {"seconds": 1.5, "rounds": 2, "forward_passes": 40}
    assert (d["n_heads_total"], d["n_removed"], d["fraction_removed"], d["saved"]) == (4, 1, 0.25, None)
    assert Stop.from_choice({"reason": "every layer is down to 0 head(s)"}).to_json() == \
        {"reason": "every layer is down to 0 head(s)"}


def test_save_writes_strict_json_through_the_policy(tmp_path):
    result = _result(loss=float("nan"))
    path = result.save(tmp_path / "prune.json")
    text = path.read_text(encoding="utf-8")
    assert text == _json.dumps(result.to_json(), indent=1)
    raw = json.loads(text)  # strict: no NaN token
    assert raw["order"][0]["loss"] is None and raw["nonfinite"]["/order/0/loss"] == "NaN"
    assert list(tmp_path.iterdir()) == [path]  # nothing else, no model folder
