"""diagnose.schema: fields format one way, sections round-trip through strict JSON and refuse what
does not fit their declaration."""

from __future__ import annotations

import json

import pytest

from diagnose import _json
from diagnose.errors import ConfigError, InputFileError
from diagnose.schema import Field, Section, fields_of, format_value


def test_format_value_one_way():
    assert [format_value(v, ".2f") for v in (None, True, "abc", 1.234, float("nan"), float("-inf"))] == \
        ["-", "yes", "abc", "1.23", "nan", "-inf"]
    assert format_value(2.6, "d") == "3"
    assert format_value(10 ** 400, ".3f") == str(10 ** 400)  # too large for a float: printed, not crashed


def test_field_refuses_bad_declarations():
    with pytest.raises(ConfigError, match="per must be"):
        Field("x", "x", per="galaxy")
    with pytest.raises(ConfigError, match="unknown places"):
        Field("x", "x", show={"cli", "moon"})
    with pytest.raises(ConfigError, match="format spec"):
        Field("x", "x", fmt="q")


def test_fields_of_keeps_declaration_order():
    fs = [Field("a", "A", show={"cli"}), Field("b", "B", show={"table"}), Field("c", "C", show={"cli", "table"})]
    assert [f.key for f in fields_of(fs, "cli")] == ["a", "c"]


def test_section_round_trips_through_strict_json():
    cols = (Field("edge", "edge", "s"), Field("delta_loss", "delta loss", ".3f", "nats"), Field("n", "n", "d"))
    sec = Section("toy", "A toy section", cols, [{"edge": "L0.H1->L1.H0", "delta_loss": 0.25, "n": 3},
                                                 {"edge": "L0.H0->out", "delta_loss": None}])
    text = _json.dumps(sec.to_json())
    back = Section.from_json(json.loads(text))
    assert back.to_json() == sec.to_json()
    assert back.cells() == [["L0.H1->L1.H0", "0.250", "3"], ["L0.H0->out", "-", "-"]]
    assert cols[1].header == "delta loss [nats]"


@pytest.mark.parametrize("obj, match", [
    ([], "must be an object"),
    ({"name": "x", "title": 3, "columns": [], "rows": []}, "'title' must be a string"),
    ({"name": "x", "title": "t", "columns": {}, "rows": []}, "needs lists"),
    ({"name": "x", "title": "t", "columns": [{"key": "a"}], "rows": [{"b": 1}]}, "no column declares"),
    ({"name": "x", "title": "t", "columns": [{"key": "a"}], "rows": [{"a": [1]}]}, "not a number"),
    ({"name": "X Y", "title": "t", "columns": [], "rows": []}, "section name"),
])
def test_section_from_json_refuses_malformed(obj, match):
    with pytest.raises(InputFileError, match=match):
        Section.from_json(obj, "f.json")
