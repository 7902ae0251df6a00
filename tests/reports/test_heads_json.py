"""Report sources with kept attention maps: the maps are parsed layer by layer into float32 arrays,
giving the same document as json.loads, and anything unusual falls back to the ordinary parser."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import report_fixtures as rf
from diagnose.errors import InputFileError
from diagnose.reports._heads_json import parse_source


def _plain(doc):
    """json.loads of the document, each example's maps as a float32 array (what the report compares)."""
    data = json.loads(json.dumps(doc))
    for ex in data.get("examples") or []:
        ex["attention"] = np.array([[[[math.nan if x is None else x for x in row] for row in h] for h in layer]
                                    for layer in ex["attention"]], dtype=np.float32)
    return data


def _same(a, b):
    for ea, eb in zip(a.pop("examples"), b.pop("examples")):
        assert isinstance(ea["attention"], np.ndarray) and ea["attention"].dtype == np.float32
        np.testing.assert_array_equal(ea.pop("attention"), eb.pop("attention"))
        assert ea == eb
    assert a == b


@pytest.mark.parametrize("indent", [None, 1])
def test_maps_parse_to_the_same_document(indent):
    doc = rf.make_heads(3, 2, seq_len=5, n_kept=2, tokens=["a", "attention", '"attention": [[', "b", "c"])
    doc["examples"][1]["attention"][2][1][3][0] = None  # the writer's NaN
    got = parse_source(json.dumps(doc, indent=indent).encode(), "h.json", "fix")
    assert math.isnan(got["examples"][1]["attention"][2, 1, 3, 0])
    _same(got, _plain(doc))


def test_fewer_queries_than_keys_keep_their_shape():
    doc = rf.make_heads(2, 2, seq_len=6, n_kept=1)
    doc["examples"][0]["attention"] = [[h[2:] for h in layer] for layer in doc["examples"][0]["attention"]]
    got = parse_source(json.dumps(doc).encode(), "h.json", "fix")
    assert got["examples"][0]["attention"].shape == (2, 2, 4, 6)


@pytest.mark.parametrize("bad", ["ragged", "string", "bool", "three_levels", "uneven_layers"])
def test_anything_unusual_is_left_to_the_ordinary_parser(bad):
    doc = rf.make_heads(2, 2, seq_len=4, n_kept=1)
    att = doc["examples"][0]["attention"]
    if bad == "ragged":
        att[1][0][2] = att[1][0][2][:-1]
    elif bad == "string":
        att[0][1][0][0] = "0.5"
    elif bad == "bool":
        att[0][1][0][0] = True
    elif bad == "three_levels":
        doc["examples"][0]["attention"] = att[0]
    else:
        att[1] = att[1][:1]
    got = parse_source(json.dumps(doc).encode(), "h.json", "fix")
    assert got == json.loads(json.dumps(doc))  # the plain lists, for the source checks to judge


def test_a_damaged_file_is_still_one_clear_error():
    text = json.dumps(rf.make_heads(2, 2, seq_len=4, n_kept=1))
    with pytest.raises(InputFileError, match=r"h\.json: not valid JSON"):
        parse_source(text[:-40].encode(), "h.json", "fix")


def test_the_rest_of_the_document_keeps_the_usual_size_bound(monkeypatch):
    import diagnose.reports._heads_json as hj

    doc = rf.make_heads(2, 2, seq_len=16, n_kept=1)
    raw = json.dumps(doc).encode()
    rest = len(raw) - len(json.dumps(doc["examples"][0]["attention"]))
    monkeypatch.setattr(hj, "REST_LIMIT", rest + 200)  # the maps alone are over it, the rest is not
    assert isinstance(parse_source(raw, "h.json", "fix")["examples"][0]["attention"], np.ndarray)
    monkeypatch.setattr(hj, "REST_LIMIT", rest - 200)
    with pytest.raises(InputFileError, match="besides its attention maps"):
        parse_source(raw, "h.json", "fix")
