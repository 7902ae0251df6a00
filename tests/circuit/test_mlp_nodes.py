"""MLPs as nodes: on the planted "relay" model (planted.py) the induction head's write reaches the logits only
through layer 1's MLP, so its direct edge is 0 and the circuit is L0.H0 -> L1.H0 (k), L1.H0 -> MLP1,
MLP1 -> output, on the reference model, GPT-2 and LLaMA (SwiGLU, RMSNorm, grouped-query attention).
Independent of the circuit code: each MLP edge's change in loss is the same model run by hand with that
path patched (the receiving norm's input minus the sender's write, its scale frozen at its clean input),
written here from the models' own modules."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from diagnose import find_circuit
from ..tolerance import approx
from . import planted_families
from .planted import planted, planted_data

pytestmark = pytest.mark.numerics

FAST = dict(task="lm", resamples=2, n_boot=200)
RELAY = {"L0.H0 -> L1.H0 (k)", "L1.H0 -> MLP1", "MLP1 -> output"}


def _loss(model, data) -> float:
    """The mean cross-entropy per scored unit (labels at their logits' positions, -100 unscored)."""
    with torch.no_grad():
        out = model(data["input_ids"])
    logits = getattr(out, "logits", out)
    scored = data["labels"] != -100
    return float(F.cross_entropy(logits[scored].float(), data["labels"][scored]))


def _hand_patched(model, data, capture, norm) -> float:
    """The change in loss when `norm` reads its input minus the write `capture()` records in the clean forward
    (a context manager filling a dict's "write" [B, T, d]), its sigma frozen at the clean input's."""
    seen: dict = {}
    with capture(seen):
        clean = _loss(model, data)

    def frozen(_m, args, _out):
        x, y = args[0], args[0] - seen["write"]
        if isinstance(norm, torch.nn.LayerNorm):
            sigma = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
            return (y - y.mean(-1, keepdim=True)) / sigma * norm.weight + norm.bias
        rms = (x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon).sqrt()  # LLaMA's RMSNorm
        return y / rms * norm.weight

    handle = norm.register_forward_hook(frozen)
    try:
        return _loss(model, data) - clean
    finally:
        handle.remove()


class _Capture:
    """A hook that records a write in the clean forward: a head's slice through its output projection
    (`weight` [H * D, d] as stored [in, out]) or a module's output."""

    def __init__(self, module, head: int | None = None, weight=None, D: int = 0):
        self.module, self.head, self.weight, self.D = module, head, weight, D

    def __call__(self, seen: dict):
        from contextlib import contextmanager

        @contextmanager
        def hooked():
            sl = slice(self.head * self.D, (self.head + 1) * self.D) if self.head is not None else None

            def output(_m, _args, out) -> None:  # a hook that returns nothing changes nothing
                seen["write"] = out.detach()

            def head_slice(_m, args) -> None:
                seen["write"] = args[0][..., sl].detach() @ self.weight[sl].detach()

            h = (self.module.register_forward_hook(output) if sl is None
                 else self.module.register_forward_pre_hook(head_slice))
            try:
                yield
            finally:
                h.remove()
        return hooked()


def _reference_ends(model):
    b = model.blocks[1]
    head = _Capture(b.attn.proj, 0, b.attn.proj.weight.T, model.cfg.head_dim)
    return {"L1.H0 -> MLP1": (head, b.ln2), "MLP1 -> output": (_Capture(b.mlp), model.ln_f)}


def _gpt2_ends(model):
    b, D = model.transformer.h[1], model.config.n_embd // model.config.n_head
    head = _Capture(b.attn.c_proj, 0, b.attn.c_proj.weight, D)  # Conv1D: stored [in, out]
    return {"L1.H0 -> MLP1": (head, b.ln_2), "MLP1 -> output": (_Capture(b.mlp), model.transformer.ln_f)}


def _llama_ends(model):
    b, m = model.model.layers[1], model.model
    head = _Capture(b.self_attn.o_proj, 0, b.self_attn.o_proj.weight.T, planted_families.HEAD_DIM)
    return {"L1.H0 -> MLP1": (head, b.post_attention_layernorm), "MLP1 -> output": (_Capture(b.mlp), m.norm)}


@pytest.fixture(scope="module")
def relay():
    model, data = planted("relay"), planted_data("relay", n=12, wrong=True)
    return model, data, find_circuit(model, data, methods=["zero", "mean"], **FAST)


@pytest.mark.parametrize("layout", ["reference", "gpt2", "llama"])
def test_an_mlp_relaying_a_head_is_in_the_circuit_and_its_edges_are_the_hand_patched_paths(relay, layout):
    if layout == "reference":
        model, data, result = relay
        ends = _reference_ends(model)
    else:
        pytest.importorskip("transformers")
        model, data = getattr(planted_families, layout)("relay"), relay[1]
        result = find_circuit(model, data, **FAST)
        ends = (_gpt2_ends if layout == "gpt2" else _llama_ends)(model)
    assert result.model["mlps"] == [0, 1] and result.notes == []
    assert {e.label for e in result.circuit.edges} == RELAY
    assert result.circuit.reached and result.circuit.faithfulness_ci[0] >= 0.8
    for e in result.edges:
        assert e.verdict == ("matters" if e.in_circuit else "negligible"), (e.edge.label, e.delta_loss)
    assert result.edge("L1.H0 -> MLP1").edge.composition == "MLP"
    for label, (capture, norm) in ends.items():
        want = _hand_patched(model, data, capture, norm)
        assert want > 1.0 and result.edge(label).delta_loss == approx(want, scale=abs(want), depth=2, width=80)


def test_the_circuit_holds_under_mean_and_the_json_names_the_mlp_nodes(relay):
    _, _, result = relay
    assert result.circuit.methods["mean"]["holds"]
    doc = json.loads(json.dumps(result.to_json()))
    edge = next(e for e in doc["circuit"]["edges"] if e["label"] == "L1.H0 -> MLP1")
    assert edge["receiver"] == [1, None] and (edge["sender_kind"], edge["receiver_kind"]) == ("head", "mlp")
    out = next(e for e in doc["circuit"]["edges"] if e["label"] == "MLP1 -> output")
    assert out["sender"] == [1, None] and (out["sender_kind"], out["receiver_kind"]) == ("mlp", "output")
    assert {(h["layer"], h["head"]) for h in doc["heads"]} == {(0, 0), (1, 0)}  # MLPs are not named heads


def test_without_mlp_nodes_the_head_reaches_the_output_through_nothing_and_the_notes_say_so():
    """Heads only (mlps=False, or an adapter that declares no MLP: the generic one on nanoGPT): the edges
    between heads, one line saying why; the relayed head's direct edge is 0, as the issue's demo case."""
    model, data = planted("relay"), planted_data("relay", n=12)
    result = find_circuit(model, data, mlps=False, **FAST)
    assert result.n_edges == 16 and result.model["mlps"] == []
    assert result.notes == ["MLP nodes were not measured: they were not asked for (mlps=False, --no-mlps)"]
    assert result.edge("L1.H0 -> output").verdict == "negligible"
    nano = find_circuit(planted_families.nano("induction"), planted_data("induction", n=8), **FAST)
    assert len(nano.notes) == 1 and "generic adapter declares no MLP" in nano.notes[0]


def test_eap_ig_ranks_the_relayed_path_first():
    """The estimator scores the MLP edges as it scores the heads': the three planted edges rank first."""
    result = find_circuit(planted("relay"), planted_data("relay", n=12), top=3, estimator="eap-ig", **FAST)
    assert {e["label"] for e in result.attribution["top"][:3]} == RELAY
    assert {e.label for e in result.circuit.edges} == RELAY


def test_the_report_draws_the_mlp_nodes_and_their_edges_apart(relay, tmp_path):
    """The circuit section's graph: MLP1 a square of its own class, the edge into it in the MLP colour."""
    from diagnose.reports import write_report

    html = write_report([relay[2]], tmp_path / "report.html").read_text()
    assert html.count('class="node node-mlp node-circuit"') == 1 and 'class="node node-mlp"' in html  # MLP1; MLP0
    assert html.count('class="edge edge-mlp"') == 1 and "L1.H0 -&gt; MLP1: Δloss" in html
    assert "MLP1 -&gt; output: Δloss" in html
