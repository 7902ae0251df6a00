"""Head grids: small models get seaborn's annotated cells, big ones one image per grid (a pixel per
head), so the picture's size does not grow with the number of heads."""

from __future__ import annotations

import base64
import math

import pytest

import report_fixtures as rf
from diagnose.reports import _plots_heads as plots
from diagnose.reports.view_heads import heads_view


def _svg(uri: str) -> str:
    return base64.b64decode(uri.split(",", 1)[1]).decode("utf-8")


@pytest.mark.slow
def test_small_grids_are_cells_and_big_grids_are_images():
    small = heads_view("s", rf.make_heads(2, 4, n_kept=0))
    assert not plots.is_image(small) and "pixelated" not in _svg(plots.head_grids(small))  # colour bars are images
    doc = rf.make_heads(20, 16, n_kept=0, vital=((3, 5),), inert=((2, 1),))
    for h in doc["heads"]:
        h["role"] = "first_token" if h["head"] % 3 == 0 else "broad"
        if h["layer"] == 7:  # a layer without numbers is drawn grey, not a crash
            h["delta_loss"] = h["attention"]["entropy"] = None
    big = heads_view("b", doc)
    assert plots.is_image(big)
    grids, attention = _svg(plots.head_grids(big)), _svg(plots.attention_grids(big))
    assert grids.count("pixelated") == 4  # Δacc, Δloss, grad importance, max weight: a pixel per head
    assert attention.count("pixelated") == 5  # entropy, first token, previous token, itself, role
    assert "<image" in _svg(plots.scatter(big))  # the points as one raster


@pytest.mark.slow
def test_big_grids_do_not_grow_with_the_number_of_heads():
    sizes = []
    for shape in ((20, 16), (80, 64)):
        v = heads_view("b", rf.make_heads(*shape, n_kept=0, vital=((3, 5),), inert=((2, 1),)))
        sizes.append(len(plots.head_grids(v)) + len(plots.attention_grids(v)) + len(plots.scatter(v)))
    assert sizes[1] < 3 * sizes[0], sizes  # 16 times the heads
    assert sizes[1] < 1.5e6, sizes


def test_every_layer_lists_every_head():
    doc = rf.make_heads(20, 16, n_kept=0, vital=((3, 5),), inert=((2, 1),))
    doc["heads"][3 * 16 + 6]["p_value"] = None
    layers = heads_view("b", doc).layers()
    assert [L.layer for L in layers] == list(range(20)) and all(len(L.rows) == 16 for L in layers)
    three = layers[3]
    assert three.n_significant == 1 and three.top_head == 5
    assert math.isclose(three.top_delta_loss, doc["heads"][3 * 16 + 5]["delta_loss"])
    row = three.rows[5]
    assert (row.head, row.label, row.significant) == (5, "L3.H5", True)
    assert row.values["delta_accuracy"] == doc["heads"][3 * 16 + 5]["delta_accuracy"]
    assert row.values["max_weight"] == doc["heads"][3 * 16 + 5]["attention"]["max_weight"]
    assert three.rows[6].values["p_value"] is None  # missing: a dash on the page, not "nan"
    assert layers[2].flagged == ["L2.H1"]
