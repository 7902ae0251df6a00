"""ALBERT applies one layer at every depth: one site per application, each with its own map (equal
to the model's own output_attentions at that depth) and its own gate (equal to zeroing that head's
output-projection weights in an unshared copy of the model, where each depth owns its weights)."""

from __future__ import annotations

import pytest
import torch

import diagnose
from diagnose.ablation import ablate_heads

from ..hooks import hook_snapshot
from ..tolerance import assert_close, assert_differ, assert_exact, size_of
from .conftest import output_of, zero_head

pytestmark = pytest.mark.numerics

transformers = pytest.importorskip("transformers")
L, H, D = 3, 4, 8


def _albert(impl="eager", groups=1):
    torch.manual_seed(0)
    cfg = transformers.AlbertConfig(vocab_size=60, embedding_size=16, hidden_size=H * D, num_hidden_layers=L,
                                    num_attention_heads=H, intermediate_size=64, max_position_embeddings=32,
                                    num_hidden_groups=groups, attn_implementation=impl)
    return transformers.AlbertForMaskedLM(cfg).eval()


def _unshared(shared):
    """The same function with each depth's own copy of the shared layer (num_hidden_groups = L)."""
    model = _albert(groups=L)
    state = shared.state_dict()
    for k, v in list(state.items()):
        if ".albert_layer_groups.0." in k:
            for g in range(1, L):
                state[k.replace(".albert_layer_groups.0.", f".albert_layer_groups.{g}.")] = v
    model.load_state_dict(state)
    return model


def _ids():
    return torch.randint(1, 60, (3, 9), generator=torch.Generator().manual_seed(1))  # [B, T]


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_one_site_and_one_map_per_application(impl):
    model = _albert(impl)
    sites = diagnose.find_heads(model)
    assert [s.application for s in sites] == [(k, L) for k in range(L)]
    assert [s.layer for s in sites] == list(range(L)) and sites[0].name.endswith("attention#0")
    cap = diagnose.capture(model, _ids())
    with torch.no_grad():
        own = _albert("eager")(_ids(), output_attentions=True).attentions  # the eager model's own maps
    assert len(cap.attention) == L
    size = size_of(model)  # maps (probabilities, scale 1) up to L layers deep, d_model wide
    for got, want in zip(cap.attention, own):
        assert_close(got, want.float(), scale=1.0, **size)  # recomputed from q, k (and sdpa) vs eager's own
    assert_differ(cap.attention[0], cap.attention[1], scale=1.0, **size)  # depths differ: not one map repeated


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_each_application_has_its_own_gate(impl):
    model, ids = _albert(impl), _ids()
    before = hook_snapshot(model)
    sites = diagnose.find_heads(model)
    unshared = _unshared(model)
    size = size_of(model)
    with torch.no_grad():
        base = output_of(model, ids)
        copy = output_of(unshared, ids)  # the unshared copy computes the same
        if impl == "eager":
            assert_exact(copy, base)  # copies of the same weights, the same operations
        else:
            assert_close(copy, base, **size)  # the copy is eager: other sums than sdpa
        for site in sites:
            k = site.application[0]
            with site.adapter.intervene(site, lambda x: x):
                assert_exact(output_of(model, ids), base)  # an identity gate passes the heads through
            with site.adapter.intervene(site, zero_head(1)):
                gated = output_of(model, ids)
            dense = unshared.albert.encoder.albert_layer_groups[k].albert_layers[0].attention.dense
            saved = dense.weight.clone()
            dense.weight[:, D:2 * D] = 0  # head 1's input columns, at depth k only
            expected = output_of(unshared, ids)
            dense.weight.copy_(saved)
            assert_close(gated, expected, **size)  # gated heads vs zeroed weights: other sums
            assert_differ(gated, base, **size)
    assert hook_snapshot(model) == before


def test_ablate_heads_reports_every_depth():
    model = _albert()
    ids = _ids()
    result = ablate_heads(model, {"input_ids": ids}, task="lm", progress=False, attention=True)
    assert result.model["n_layers"] == L and len(result.heads) == L * H
    assert result.model["shared"] == [{"module": "albert.encoder.albert_layer_groups.0.albert_layers.0.attention",
                                       "applications": L, "layers": list(range(L))}]
    assert len({h.delta_loss for h in result.heads}) > H  # not one effect repeated at every depth


def test_the_sharing_is_said_in_words_for_the_cli_and_the_report():
    from diagnose.reports._summary import heads_verdict
    from diagnose.reports.view_heads import heads_view

    result = ablate_heads(_albert(), {"input_ids": _ids()}, task="lm", progress=False, attention=False)
    lines = dict(heads_verdict(heads_view("albert", result.to_json())).lines)
    assert "applied 3 times per forward" in lines["Shared layers"] and "L0, L1, L2" in lines["Shared layers"]


def test_a_hand_written_block_applied_twice_is_two_sites():
    from ..nano import NanoGPT

    model = NanoGPT(n_layers=2)
    model.h = torch.nn.ModuleList([model.h[0], model.h[0]])  # one block, applied at both depths
    ids = torch.randint(1, 50, (2, 8))
    sites = diagnose.find_heads(model, example=ids)
    assert [(s.name, s.application) for s in sites] == [("h.0.attn#0", (0, 2)), ("h.0.attn#1", (1, 2))]
    cap = diagnose.capture(model, ids)
    with torch.no_grad():  # the second application's map, from its own input
        x = model.wte(ids) + model.wpe(torch.arange(8))
        x = model.h[0](x, None)
        want = model.h[0].attn.scores(model.h[0].ln_1(x))
    assert_exact(cap.attention[1], want)  # the same modules on the same input, in the same order
