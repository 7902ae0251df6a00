"""Circuits on another family: a tiny GPT-2 (fused Conv1D [q; k; v] stored [in, out], LayerNorms).

Independent of the circuit code: each head's output edge is its direct effect as the head ablation
measures it (ablation/direct.py: the head's write through the frozen final norm)."""

from __future__ import annotations

import pytest
import torch

from diagnose import find_circuit
from diagnose.ablation import ablate_heads
from ..tolerance import approx

pytestmark = pytest.mark.numerics
transformers = pytest.importorskip("transformers")


def _gpt2(n_layer: int = 2):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=n_layer, n_head=2, n_embd=32, vocab_size=24, n_positions=16, bos_token_id=0,
                                  eos_token_id=0, attn_implementation="eager", resid_pdrop=0, embd_pdrop=0,
                                  attn_pdrop=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # heads strong enough that their edges are well above rounding
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(8)
            block.attn.c_proj.weight.mul_(4)
    return model, {"input_ids": torch.randint(0, 24, (12, 10), generator=torch.Generator().manual_seed(1))}


def test_gpt2_output_edges_are_the_heads_direct_effects():
    model, data = _gpt2()
    result = find_circuit(model, data, task="lm", resamples=2, n_boot=200)
    # 16 edges between heads and to the output, 15 of the MLP nodes: 2 + 4 heads -> MLP0, MLP1; MLP0 -> MLP1;
    # MLP0 -> each layer-1 head's q, k, v (6); each MLP -> output (2)
    assert result.model["family"] == "hf-gpt2" and result.n_edges == 16 + 15 and len(result.edges) == 31
    heads = ablate_heads(model, data, task="lm", progress=False, attention=False)
    for h in heads.heads:
        edge = result.edge(f"L{h.layer}.H{h.head} -> output")
        assert edge.delta_loss == approx(h.direct_delta_loss, scale=1.0), (h.layer, h.head)
    assert {e.edge.composition for e in result.edges} == {"Q", "K", "V", "direct", "MLP"}


def test_llama_grouped_query_attention_keys_and_values_are_key_value_heads():
    """Separate q/k/v projections and RMSNorm; a k or v receiver is one of the 2 key/value heads."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=24, max_position_embeddings=16,
                                   attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).eval()
    data = {"input_ids": torch.randint(0, 24, (8, 10), generator=torch.Generator().manual_seed(1))}
    result = find_circuit(model, data, task="lm", resamples=2, n_boot=200)
    # q: 4 query heads x 5 senders (4 heads, MLP0); k, v: 2 kv heads x 5 senders; MLP0 reads layer 0's 4 heads,
    # MLP1 them, MLP0 and layer 1's 4; 10 outputs (8 heads, 2 MLPs)
    assert result.n_edges == 4 * 5 + 2 * 2 * 5 + 4 + 9 + 10
    assert {e.edge.receiver[1] for e in result.edges if e.edge.part in "kv" and e.edge.receiver} == {0, 1}
    heads = ablate_heads(model, data, task="lm", progress=False, attention=False)
    for h in heads.heads:
        edge = result.edge(f"L{h.layer}.H{h.head} -> output")
        assert edge.delta_loss == approx(h.direct_delta_loss, scale=1.0), (h.layer, h.head)


def test_replaying_the_clean_prefix_changes_no_outcome():
    """The blocks before the earliest moved input replay their clean output and their senders' clean writes
    (patch.py): every single edge and a few circuits (many edges removed) give what full forwards give."""
    from diagnose.ablation.gate import gated
    from diagnose.ablation.sweep import Sweep
    from diagnose.circuit import patch
    from diagnose.circuit.edges import all_edges
    from diagnose.circuit.wiring import wiring
    from diagnose.sites import find_heads
    from ..tolerance import assert_close

    model, data = _gpt2(n_layer=3)
    batches = [({"input_ids": data["input_ids"][:6]}, None), ({"input_ids": data["input_ids"][6:]}, None)]
    sites = find_heads(model, example=batches[0][0])
    edges = all_edges(sites)
    g = torch.Generator().manual_seed(2)
    sets = torch.cat([torch.eye(len(edges), dtype=torch.bool)[torch.randperm(len(edges), generator=g)],
                      torch.rand(4, len(edges), generator=g) > 0.5])
    got = {}
    with gated(sites) as gates:
        for reuse in (False, True):
            patcher = patch.Patcher(Sweep(model, sites, gates, "lm", reuse=reuse), wiring(model, sites, batches[0][0]),
                                    edges)
            got[reuse] = patch.over_data(patcher, batches, sets).set_loss
            assert patcher.replaying == reuse and bool(patcher.checked) == reuse
    assert_close(torch.as_tensor(got[True]), torch.as_tensor(got[False]), depth=3, width=32)


def test_a_circuit_edge_whose_receiver_reaches_nothing_changes_nothing():
    """Every edge out of L1.H0 removed (the output, MLP1), its key edge kept: the circuit's loss is the empty
    circuit's, the sender's output taken off exactly, however much the large MLP writes move each norm's
    scale (patch.py: each moved norm frozen at its clean scale, its own output too)."""
    from diagnose.ablation.gate import gated
    from diagnose.ablation.sweep import Sweep
    from diagnose.circuit import patch
    from diagnose.circuit.edges import all_edges, parse_edge
    from diagnose.circuit.minimal import removed_sets
    from diagnose.circuit.mlp import mlp_gated
    from diagnose.circuit.wiring import wiring
    from diagnose.sites import find_heads
    from ..tolerance import assert_close, assert_differ

    model, data = _gpt2()
    with torch.no_grad():
        for block in model.transformer.h:
            block.mlp.c_proj.weight.mul_(8)
    batches = [({"input_ids": data["input_ids"]}, None)]
    sites = find_heads(model, example=batches[0][0])
    with gated(sites) as gates:
        wired = wiring(model, sites, batches[0][0])
        with mlp_gated(wired.mlps) as mlp_gates:
            edges = all_edges(sites, [m.site.layer for m in wired.mlps])
            patcher = patch.Patcher(Sweep(model, sites, gates, "lm"), wired, edges, mlp_gates=mlp_gates)
            kept = [frozenset(), frozenset({parse_edge("L0.H0->L1.H0(k)")}), frozenset({parse_edge("L1.H0->output")})]
            loss = torch.as_tensor(patch.over_data(patcher, batches, removed_sets(kept, edges)).set_loss)
    assert_close(loss[:, 1], loss[:, 0], depth=2, width=32, dtype=torch.float32)
    # a kept edge that reaches the output does count
    assert_differ(loss[:, 2], loss[:, 0], depth=2, width=32, dtype=torch.float32)
