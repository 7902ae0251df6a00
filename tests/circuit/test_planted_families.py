"""Ground truth in other layouts: the planted circuits of planted.py set into GPT-2 (fused Conv1D), the
hand-written nanoGPT-style model (the generic adapter, its path to the output traced) and a LLaMA with
grouped-query attention (rotary positions, RMSNorm, 2 query heads sharing 1 key/value head), by
planted_families.py. The circuit found is exactly the planted one, its composition named, every other
edge negligible; the backup shows as the self-repair gap."""

from __future__ import annotations

import pytest

from diagnose import find_circuit
from diagnose.ablation import ablate_heads
from ..tolerance import approx, loss_tol
from .planted import D_MODEL
from . import planted_families
from .planted import planted, planted_data

pytestmark = pytest.mark.numerics
pytest.importorskip("transformers")

FAST = dict(task="lm", resamples=2, n_boot=200)
PLANTED = {"induction": ("L0.H0 -> L1.H0 (k)", "K"), "q": ("L0.H0 -> L1.H0 (q)", "Q"),
           "v": ("L0.H0 -> L1.H0 (v)", "V"), "backup": ("L0.H0 -> L1.H0 (k)", "K")}
FAMILY = {"gpt2": "hf-gpt2", "nano": "generic", "llama": "hf-llama"}


@pytest.mark.parametrize("kind", list(PLANTED))
@pytest.mark.parametrize("layout", list(FAMILY))
def test_the_planted_circuit_is_found_in_every_layout(layout, kind):
    model = getattr(planted_families, layout)(kind)
    result = find_circuit(model, planted_data(kind, n=12), **FAST)
    label, composition = PLANTED[kind]
    assert result.model["family"] == FAMILY[layout]
    assert {e.label for e in result.circuit.edges} == {label, "L1.H0 -> output"}
    assert result.edge(label).edge.composition == composition and result.edge(label).verdict == "matters"
    assert result.circuit.reached and result.circuit.faithfulness_ci[0] >= 0.8
    # every other edge negligible; the backup's own (L1.H1's) detectable at most, it is idle until needed
    outside = {e.edge.label: e.verdict for e in result.edges if not e.in_circuit}
    idle = {k for k in outside if kind == "backup" and "L1.H1" in k}
    assert {k: v for k, v in outside.items() if v != "negligible" and k not in idle} == {}
    assert all(outside[k] in ("negligible", "detectable but negligible") for k in idle)
    out = result.edge("L1.H0 -> output")
    # the backup (L1.H1) makes up for L1.H0's output alone, not inside the circuit (it is outside it)
    assert (out.self_repair_gap > 1.0 and out.delta_loss < 0.1 * out.effect_in_circuit) == (kind == "backup")


@pytest.mark.parametrize("layout", ["nano", "llama"])
def test_the_heads_are_named_and_the_output_edge_is_the_direct_effect(layout):
    """Independent of the circuit code: the heads sweep's direct effect is the output edge (nano's path to the
    output is traced here, so it is checked against the reference model whose weights it holds, through the
    reference adapter's declared path), and the attention statistics name the two heads."""
    model, data = getattr(planted_families, layout)("induction"), planted_data("induction", n=12)
    result = find_circuit(model, data, **FAST)
    roles = {(h["layer"], h["head"]): h["role"] for h in result.heads}
    assert roles == {(0, 0): "prev_token", (1, 0): "induction"}
    heads = ablate_heads(planted("induction") if layout == "nano" else model, data, task="lm", progress=False,
                         attention=False)
    direct = next(h for h in heads.heads if (h.layer, h.head) == (1, 0)).direct_delta_loss
    assert result.edge("L1.H0 -> output").delta_loss == approx(direct, scale=max(1.0, abs(direct)))


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
def test_a_circuit_of_many_edges_moves_its_receivers_as_one_product_per_sender_would(layout, monkeypatch):
    """The minimal circuit's sets move many edges at once; those are summed per receiver block before the
    frozen norm and the projection (patch._mixed, both linear), which must give what one product per
    sender gives (MIX_ABOVE raised: the per-sender path everywhere)."""
    from diagnose.circuit import mixing, patch

    model, data = getattr(planted_families, layout)("backup"), planted_data("backup", n=8)
    calls, mix, prefix = [], patch.Patcher._mixed, mixing.prefix
    monkeypatch.setattr(patch.Patcher, "_mixed", lambda self, *a: calls.append("mixed") or mix(self, *a))
    monkeypatch.setattr(mixing, "prefix", lambda *a: calls.append("all") or prefix(*a))
    mixed = find_circuit(model, data, **FAST)
    assert {"mixed", "all"} <= set(calls)  # the search's sets took the mixed path, most as all less the kept
    monkeypatch.setattr(patch, "MIX_ABOVE", 10 ** 9)
    apart = find_circuit(model, data, **FAST)
    assert [e.label for e in mixed.circuit.edges] == [e.label for e in apart.circuit.edges]
    tol = loss_tol(mixed.baseline["loss"], depth=2, width=D_MODEL)  # losses of two orders of sums
    inside = [(e.effect_in_circuit, a.effect_in_circuit) for e, a in zip(mixed.edges, apart.edges) if e.in_circuit]
    assert inside and all(abs(x - y) <= tol for x, y in inside)
    assert mixed.circuit.faithfulness == approx(apart.circuit.faithfulness, depth=2, width=D_MODEL)
