"""The report on real outputs: a monitored training run, an ablation sweep and the wiring
checks of one small reference model, as objects and as the files the CLI writes."""

import json
import math

import numpy as np
import pytest

from diagnose import read_run
from diagnose._head_label import head_label
from diagnose.reports._sources import load_sources
from diagnose.reports._view import build_report
from ..tolerance import approx, magnitude, tol

pytestmark = pytest.mark.numerics


def test_report_from_objects_matches_the_results(real, real_report):
    d, result, findings = real
    html = real_report.read_text()
    for section in ("summary", "heads", "maps", "training", "checks", "circuit"):
        assert f'<section id="{section}">' in html
    blob = json.loads(html.split('id="report-data">', 1)[1].split("</script>", 1)[0])
    assert [e["tokens"] for e in blob["heads"][0]["examples"]] == [e["tokens"] for e in result.examples]
    # one language (issue 23): "matter" only for significant heads outside the negligible band
    n_matters = sum(h.verdict == "matters" for h in result.heads)
    n_small = sum(h.verdict == "detectable but negligible" for h in result.heads)
    assert (f"{n_matters} of 4 heads matter" if n_matters else "No single head matters") in html
    more = " more" if n_matters else ""
    assert (f"{n_small}{more} {'is' if n_small == 1 else 'are'} detectable but negligible" in html) == (n_small > 0)
    assert "significantly" not in html
    top = result.ranked()[0]
    assert f"the largest effects: {head_label(top.layer, top.head)} (" in html


def test_files_give_the_same_views(real):
    d, result, findings = real
    from_files = build_report(load_sources([d / "heads.json", d / "run", d / "checks.json"]))
    v = from_files.heads[0].view
    for h in result.heads:
        got = v.grids["delta_loss"][h.layer, h.head]  # kept as float32; NaN where the sweep had no number
        assert math.isnan(got) if h.delta_loss is None else got == approx(h.delta_loss)
        assert v.significant[h.layer, h.head] == bool(h.significant)
    run = read_run(d / "run")
    t = from_files.training[0].view
    assert t.n_records == len(run.steps) == 40
    assert t.layer_names == run.layers
    assert t.entropy is not None and t.entropy.values.shape[1] == 4  # 2 sites x 2 heads
    want = run.steps["loss"].to_numpy()
    assert np.allclose(t.loss[1], want, rtol=0, atol=tol(magnitude(want)), equal_nan=True)  # float32 copies
    assert len(from_files.checks[0].findings) == len(findings)


def test_a_head_of_the_circuit_links_to_it(real_report, planted_circuit):
    """The heads section names the circuit of the same model (family, layers x heads) and links each of its
    heads to its row in the circuit section; a model of another shape gets no link."""
    html = real_report.read_text()
    for layer, head in sorted({e.sender for e in planted_circuit.circuit.edges}):
        assert f'<a href="#circuit-1-head-{layer}-{head}">{head_label(layer, head)}</a>' in html
        assert f'<tr id="circuit-1-head-{layer}-{head}">' in html
    assert '<article class="circuit-source" id="circuit-1">' in html and '<a href="#circuit-1">' in html
    from diagnose.reports.view_circuit import check_circuit, circuit_section, links_for

    doc = json.loads(json.dumps(planted_circuit.to_json()))
    section = circuit_section("c", check_circuit(doc, "c.json"), [])
    assert links_for("h", "reference", 2, 2, [section])[0] is section
    assert links_for("h", "reference", 2, 4, [section]) == (None, {})  # another shape: another model
    assert links_for("h", "hf-gpt2", 2, 2, [section]) == (None, {})
