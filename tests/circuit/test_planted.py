"""Ground truth: on hand-wired models (planted.py) the circuit found is exactly the one planted, with
intervals, its composition named, under zero and mean ablation; the estimates rank it first."""

from __future__ import annotations

import json

import pytest
import torch

from diagnose import find_circuit
from diagnose.ablation import ablate_heads
from diagnose.circuit.edges import Edge
from ..hooks import hook_snapshot
from ..tolerance import approx
from .planted import planted, planted_data

pytestmark = pytest.mark.numerics

FAST = dict(task="lm", resamples=4, n_boot=400)
PLANTED = {"induction": ("L0.H0 -> L1.H0 (k)", "K"), "q": ("L0.H0 -> L1.H0 (q)", "Q"),
           "v": ("L0.H0 -> L1.H0 (v)", "V")}


@pytest.fixture(scope="module")
def induction():
    model, data = planted("induction"), planted_data("induction", n=16, wrong=True)
    before = (hook_snapshot(model), {k: v.clone() for k, v in model.state_dict().items()})
    result = find_circuit(model, data, methods=["zero", "mean"], **FAST)
    return model, data, result, before


def test_the_induction_circuit_is_exactly_the_planted_one(induction):
    _, _, result, _ = induction
    assert {e.label for e in result.circuit.edges} == {"L0.H0 -> L1.H0 (k)", "L1.H0 -> output"}
    assert result.edge("L0.H0 -> L1.H0 (k)").edge.composition == "K"
    assert result.circuit.reached and result.circuit.faithfulness_ci[0] >= 0.8
    assert result.circuit.methods["mean"]["holds"]
    for e in result.edges:
        expected = "matters" if e.in_circuit else "negligible"
        assert e.verdict == expected, (e.edge.label, e.delta_loss, e.delta_loss_ci)
    inside = [e for e in result.edges if e.in_circuit]
    assert all(e.inclusion == 1.0 and e.delta_loss_ci[0] > 0.5 for e in inside)
    roles = {(h["layer"], h["head"]): h["role"] for h in result.heads}
    assert roles == {(0, 0): "prev_token", (1, 0): "induction"}


def test_find_circuit_leaves_no_hook_and_the_weights_as_they_were(induction):
    model, _, _, (hooks, weights) = induction
    assert hook_snapshot(model) == hooks
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k


def test_an_output_edge_is_the_heads_direct_effect(induction):
    """Independent: the head ablation's direct effect (ablation/direct.py) of L1.H0 is its output edge."""
    model, data, result, _ = induction
    heads = ablate_heads(model, data, task="lm", progress=False, attention=False)
    direct = next(h for h in heads.heads if (h.layer, h.head) == (1, 0)).direct_delta_loss
    assert result.edge("L1.H0 -> output").delta_loss == approx(direct, scale=max(1.0, abs(direct)))


def test_the_json_is_strict_and_the_frame_has_a_row_per_edge(induction, tmp_path):
    _, _, result, _ = induction
    path = result.save(tmp_path / "circuit.json")
    doc = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    # 16 edges between heads and to the output, 15 of the MLP nodes (test_families.py counts them)
    assert doc["schema"] == "diagnose.circuit/1" and doc["n_edges"] == 31 and len(doc["edges"]) == 31
    assert [e["label"] for e in doc["circuit"]["edges"]] == [e.label for e in result.circuit.edges]
    frame = result.to_frame()
    assert len(frame) == 31 and set(frame["composition"]) == {"Q", "K", "V", "direct", "MLP"}


def _frozen_final_norm_logit_diff(model, data) -> tuple[float, float]:
    """Independent of the circuit code: the logit difference label - wrong per unit, clean and with L1.H0's
    output-projection slice zeroed while the final LayerNorm keeps its clean sigma (the direct path alone)."""
    ln, seen = model.ln_f, {}
    both = (data["labels"] != -100) & (data["wrong_labels"] != -100)

    def diff():
        with torch.no_grad():
            logits = model(data["input_ids"])
        pick = lambda t: logits[both].gather(1, t[both][:, None])[:, 0]  # noqa: E731
        return float((pick(data["labels"]) - pick(data["wrong_labels"])).mean())

    def frozen(_m, args, _out):
        x = args[0]
        seen.setdefault("sigma", (x.var(-1, unbiased=False, keepdim=True) + ln.eps).sqrt())
        return (x - x.mean(-1, keepdim=True)) / seen["sigma"] * ln.weight + ln.bias

    handle = ln.register_forward_hook(frozen)
    try:
        clean = diff()
        proj, D = model.blocks[1].attn.proj.weight, model.cfg.head_dim
        saved = proj.detach().clone()
        with torch.no_grad():
            proj[:, :D] = 0
        ablated = diff()
        with torch.no_grad():
            proj.copy_(saved)
    finally:
        handle.remove()
    return clean, ablated


def test_the_logit_difference_per_edge_and_for_the_circuit(induction):
    """Data naming a wrong answer per unit: each edge's change in logit difference with its interval, and the
    circuit's faithfulness of it; the output edge's against a frozen-final-norm forward with the head zeroed."""
    model, data, result, _ = induction
    clean, ablated = _frozen_final_norm_logit_diff(model, data)
    assert result.baseline["logit_diff"] == approx(clean, scale=abs(clean))
    out = result.edge("L1.H0 -> output")
    assert out.delta_logit_diff == approx(ablated - clean, scale=abs(clean))
    for e in result.edges:
        lo, hi = e.delta_logit_diff_ci
        assert lo <= e.delta_logit_diff <= hi
        assert (hi < -0.5 * clean) == e.in_circuit, (e.edge.label, e.delta_logit_diff, e.delta_logit_diff_ci)
    c = result.circuit
    assert c.faithfulness_logit_diff >= 0.8 and c.faithfulness_logit_diff_ci[0] >= 0.8
    assert c.methods["mean"]["faithfulness_logit_diff"] >= 0.8
    assert result.to_frame()["delta_logit_diff_ci_high"].notna().all()


@pytest.mark.parametrize("kind", ["q", "v"])
def test_planted_q_and_v_composition(kind):
    result = find_circuit(planted(kind), planted_data(kind, n=12), **FAST)
    label, composition = PLANTED[kind]
    assert {e.label for e in result.circuit.edges} == {label, "L1.H0 -> output"}
    assert result.edge(label).edge.composition == composition and result.edge(label).verdict == "matters"
    # no wrong answers named: no logit difference anywhere
    assert "logit_diff" not in result.baseline and result.circuit.faithfulness_logit_diff is None
    assert all(e.delta_logit_diff is None for e in result.edges)


def test_eap_ig_ranks_the_planted_edges_first():
    """A saturated model's clean gradient is ~0 (EAP misses it); integrated gradients find the edges."""
    events = []
    result = find_circuit(planted("induction"), planted_data("induction", n=12), top=4, estimator="eap-ig",
                          progress=events.append, **FAST)
    top = {e["label"] for e in result.attribution["top"][:2]}
    assert top == {"L0.H0 -> L1.H0 (k)", "L1.H0 -> output"}
    assert {e.label for e in result.circuit.edges} == top
    # every stage says its name, so a long one is never silent (the CLI logs them as diagnose heads does)
    assert list(dict.fromkeys(e.stage for e in events)) == [
        f"attributing {result.n_edges} edges (eap-ig)", "patching 4 edges exactly",
        "the minimal circuit and its stability", "attention statistics"]
    exact = [e for e in events if e.stage == "patching 4 edges exactly"]
    assert exact[0].done == 0 and exact[-1].done == exact[-1].total > 0
    assert [e.forwards for e in events] == sorted(e.forwards for e in events)
    assert events[-1].forwards == result.timing["forwards"]


def test_edge_labels_parse_back():
    from diagnose.circuit.edges import parse_edge

    for e in (Edge((0, 1), (2, 0), "k"), Edge((1, 0), None, "out")):
        assert parse_edge(e.label) == e


def test_a_backup_head_shows_as_the_self_repair_gap():
    """L1.H1 copies what L1.H0 does, weaker: L1.H0's edges cost little alone and much inside the circuit."""
    result = find_circuit(planted("backup"), planted_data("backup", n=12), **FAST)
    assert {e.label for e in result.circuit.edges} == {"L0.H0 -> L1.H0 (k)", "L1.H0 -> output"}
    out = result.edge("L1.H0 -> output")
    assert out.delta_loss < 0.1 * out.effect_in_circuit  # alone, the backup makes up for it
    assert out.self_repair_gap == approx(out.effect_in_circuit - out.delta_loss)
    assert out.self_repair_gap > 1.0 and out.verdict == "matters"
    assert result.edge("L1.H1 -> output").delta_loss < out.delta_loss  # the backup itself is idle until needed
