"""Run-folder records with the wrong types are refused naming the file and line."""

from __future__ import annotations

import pytest

from diagnose.errors import RunFolderError
from diagnose.monitor._records import check_alert, check_info, check_record

GOOD = {"step": 3, "time": 0.1, "loss": float("nan"), "lr": None, "grad_norm": 1.0,
        "layers": {"blocks.0": {"grad_norm": 0.5, "act_var": float("inf")}},
        "attention": {"blocks.0.attn": {"entropy": [1.0, 2.0], "max_weight": [0.5, 0.6]}}}


def test_good_record_passes():
    check_record(GOOD, "m.jsonl, line 1")
    check_record({**GOOD, "lr": [1e-3, 2e-3]}, "m.jsonl, line 1")  # lr=scheduler.get_last_lr()
    check_info({"schema": "diagnose.run/1", "model": {"blocks": ["a"]}, "sessions": [{}]}, "run.json")
    check_alert({"step": 1, "kind": "grad_spike", "message": "m"}, "alerts.jsonl, line 1")


@pytest.mark.parametrize("change,words", [
    ({"step": "3"}, "`step` is a string"), ({"step": True}, "`step` is a bool"), ({"lr": "1e-3"}, "`lr` is a string"),
    ({"layers": [1]}, "`layers` is a list"), ({"layers": {"b": {"grad_norm": "x"}}}, "layers.b"),
    ({"attention": {"s": {"entropy": "high"}}}, "attention.s.entropy"), ({"attention": {"s": 1}}, "attention.s"),
])
def test_bad_record_names_line_and_field(change, words):
    with pytest.raises(RunFolderError, match=words) as err:
        check_record({**GOOD, **change}, "m.jsonl, line 7")
    assert str(err.value).startswith("m.jsonl, line 7: ")


@pytest.mark.parametrize("info,words", [([1], "holds a list"), ({"model": "gpt"}, "`model` is a string"),
                                        ({"model": {"blocks": [1]}}, "model.blocks"), ({"sessions": [1]}, "sessions")])
def test_bad_info(info, words):
    with pytest.raises(RunFolderError, match=words):
        check_info(info, "run.json")


def test_bad_alert():
    with pytest.raises(RunFolderError, match="`message` is an object"):
        check_alert({"message": {"a": 1}}, "alerts.jsonl, line 2")
