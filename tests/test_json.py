"""The one strict-JSON policy: non-finite numbers as null plus a `nonfinite` map of JSON
Pointers, read back exactly; old files with bare NaN/Infinity still read."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from diagnose import _json


def _strict(text):
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c}"))


def test_nonfinite_becomes_null_with_exact_pointers_and_reads_back():
    obj = {"loss": math.nan, "ok": 1.5, "a/b": {"~x": [1.0, math.inf, -math.inf]}, "n": np.float32("nan"),
           "t": torch.tensor(float("inf")), "nested": [{"v": math.nan}], "tuple": (math.inf,)}
    text = _json.dumps(obj)
    doc = _strict(text)
    assert doc["loss"] is None and doc["a/b"]["~x"] == [1.0, None, None] and doc["n"] is None and doc["t"] is None
    assert doc["nonfinite"] == {"/loss": "NaN", "/a~1b/~0x/1": "Infinity", "/a~1b/~0x/2": "-Infinity", "/n": "NaN",
                                "/t": "Infinity", "/nested/0/v": "NaN", "/tuple/0": "Infinity"}
    back = _json.loads(text)
    assert math.isnan(back["loss"]) and back["a/b"]["~x"][1:] == [math.inf, -math.inf] and back["t"] == math.inf
    assert math.isnan(back["nested"][0]["v"]) and back["tuple"] == [math.inf] and "nonfinite" not in back


def test_finite_documents_are_unchanged_and_compact_is_one_line():
    obj = {"step": 3, "loss": 0.25, "name": "NaN", "flag": True, "none": None}
    assert _json.loads(_json.dumps(obj)) == obj  # the string "NaN" stays a string
    line = _json.dumps({"x": [1, math.nan]}, compact=True)
    assert "\n" not in line and " " not in line


def test_old_bare_tokens_and_hostile_maps():
    old = _json.loads('{"loss": NaN, "g": Infinity, "h": -Infinity}')
    assert math.isnan(old["loss"]) and old["g"] == math.inf and old["h"] == -math.inf
    # a hand-written map may point anywhere: only nulls it names are replaced, nothing raises
    doc = _json.loads('{"a": 1, "b": null, "c": [null], "nonfinite": {"/a": "NaN", "/b": "bogus", "/c/5": "NaN", '
                      '"/c/0": "-Infinity", "x": "NaN", "/zz/y": "NaN", "/a/b": "NaN"}}')
    assert doc == {"a": 1, "b": None, "c": [-math.inf]}
    assert _json.loads('{"nonfinite": "not a map", "a": null}') == {"nonfinite": "not a map", "a": None}
    assert _json.loads("[1, NaN]")[0] == 1


def test_a_stale_map_in_the_input_object_is_replaced():
    assert _strict(_json.dumps({"a": 1.0, "nonfinite": {"/a": "NaN"}})) == {"a": 1.0}
