"""`diagnose circuit` end to end on saved files: the table, strict JSON, the report section; bad input refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from diagnose import save_checkpoint
from .planted import planted, planted_data

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from hostile import assert_refused, invoke  # noqa: E402

pytestmark = pytest.mark.numerics


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("circuit")
    save_checkpoint(planted("induction"), d / "model.pt", meta={"task": "lm"})
    torch.save(planted_data("induction", n=12, wrong=True), d / "eval.pt")
    return d


def test_circuit_writes_its_json_and_report(files):
    res = invoke("circuit", files / "model.pt", "--data", files / "eval.pt", "--methods", "zero,mean",
                 "--json", files / "c.json", "--html", files / "c.html")
    assert res.exit_code == 0, res.output
    assert "Circuit edges (path patching)" in res.output and "under mean" in res.output
    doc = json.loads((files / "c.json").read_text(), parse_constant=lambda c: pytest.fail(f"non-strict {c}"))
    assert doc["schema"] == "diagnose.circuit/1" and doc["method"] == "zero"
    assert {e["label"] for e in doc["circuit"]["edges"]} == {"L0.H0 -> L1.H0 (k)", "L1.H0 -> output"}
    # the data names a wrong answer per unit: the logit difference beside the loss, per edge and for the circuit
    out = " ".join(res.output.split())
    assert f"logit diff {doc['baseline']['logit_diff']:.3f} (label - wrong answer)" in out and "Δlogit" in out
    assert "of the logit difference's" in out and doc["circuit"]["faithfulness_logit_diff"] >= 0.8
    assert all(len(e["delta_logit_diff_ci"]) == 2 for e in doc["edges"])
    html = (files / "c.html").read_text()
    assert '<section id="circuit">' in html and "L0.H0 -&gt; L1.H0 (k): Δloss" in html
    assert "faithfulness, logit diff" in html and "; Δlogit diff -" in html


@pytest.mark.parametrize("args, names", [
    (("--data", "missing.pt"), ("missing.pt",)),
    (("--data", "eval.pt", "--methods", "zero,nosuch"), ("nosuch",)),
])
def test_bad_input_is_one_line_and_exit_2(files, args, names):
    args = [files / a if a.endswith(".pt") else a for a in args]
    assert_refused(invoke("circuit", files / "model.pt", *args), *names)


def test_a_share_outside_0_to_1_is_refused_by_its_option(files):
    res = invoke("circuit", files / "model.pt", "--data", files / "eval.pt", "--faithfulness", "1.5")
    assert res.exit_code == 2 and "--faithfulness" in res.output


def test_no_mlps_gives_the_heads_edges_and_says_so_once(files):
    res = invoke("circuit", files / "model.pt", "--data", files / "eval.pt", "--no-mlps", "--json", files / "h.json")
    assert res.exit_code == 0, res.output
    assert res.output.count("MLP nodes were not measured") == 1 and "(MLP nodes in" not in res.output
    doc = json.loads((files / "h.json").read_text())
    assert doc["n_edges"] == 16 and doc["model"]["mlps"] == [] and len(doc["notes"]) == 1
    assert {e["receiver_kind"] for e in doc["edges"]} == {"head", "output"}
