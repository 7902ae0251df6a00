"""Logits at the scored positions only (ablation/scored.py): the cut gives the full logits' values there, the
sweep's every figure equals the uncut sweep's and an independent head removal's, and the memory plan bounds
the logits that are made (a tiny LLaMA with a large vocabulary, the shape of a real LM's output layer)."""

from __future__ import annotations

import pytest
import torch

import diagnose.ablation.engine as engine
from diagnose.ablation import ablate_heads
from diagnose.ablation.plan import footprint, plan_sweep
from diagnose.ablation.scored import ScoredOnly, output_layer, positions
from diagnose.objectives import IGNORE, score
from diagnose.sites import find_heads

from .helpers import assert_untouched, snapshot, with_head_weights_zeroed
from ..tolerance import approx, assert_close, loss_tol, size_of

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.numerics

V, T, N = 4096, 10, 8


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=16,
                                   intermediate_size=32, vocab_size=V, max_position_embeddings=T,
                                   tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def ioi():
    """IOI-shaped data: labels IGNORE except the answer (the last position), two answers in one example."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (N, T), generator=g)
    labels = torch.full_like(ids, IGNORE)
    labels[:, -1] = torch.randint(0, V, (N,), generator=g)
    labels[3, 4] = 7
    return {"input_ids": ids, "labels": labels}


def test_positions_keep_each_examples_scored_ones_first():
    t = torch.full((3, 8), IGNORE)
    t[0, 7], t[1, 2], t[1, 5] = 1, 2, 3
    index, kept = positions(t)
    assert index.shape == (3, 2) and index[0, 0] == 7 and index[1].tolist() == [2, 5]
    assert kept[0].tolist() == [1, IGNORE] and kept[1].tolist() == [2, 3] and kept[2].tolist() == [IGNORE, IGNORE]
    assert positions(torch.zeros(3, 8, dtype=torch.long)) is None  # every position scored: nothing to cut


def test_cut_logits_are_the_full_ones_at_the_scored_positions(lm, ioi):
    cut = ScoredOnly(output_layer(lm, find_heads(lm)))
    index, targets = positions(ioi["labels"])
    before = snapshot(lm)
    with torch.no_grad():
        full = lm(input_ids=ioi["input_ids"]).logits  # [N, T, V]
        with cut.at(index):
            kept = lm(input_ids=ioi["input_ids"]).logits  # [N, S, V]
    assert_untouched(lm, before)  # the hook is gone
    want = full.gather(1, index[..., None].expand(-1, -1, V))
    assert_close(kept, want, **size_of(lm))
    a, b = score(kept, targets), score(full, ioi["labels"])
    assert a.loss_sum.tolist() == approx(b.loss_sum.tolist(), **size_of(lm)) and torch.equal(a.count, b.count)


def test_sweep_with_the_cut_equals_the_full_logits_and_a_zeroed_head(lm, ioi, monkeypatch):
    kw = dict(task="lm", batch_size=N, progress=False, attention=False)
    cut = ablate_heads(lm, ioi, **kw)
    assert cut.timing["logits"] == {"used": True, "reason": None}
    monkeypatch.setattr(engine, "output_layer", lambda model, sites: None)
    full = ablate_heads(lm, ioi, **kw)
    assert full.timing["logits"]["used"] is False and "declares no output layer" in full.timing["logits"]["reason"]
    assert cut.timing["memory_plan"]["estimated_step_bytes"] < full.timing["memory_plan"]["estimated_step_bytes"]
    tol = loss_tol(full.baseline["loss"], **size_of(lm))
    assert cut.baseline["loss"] == pytest.approx(full.baseline["loss"], abs=tol)
    for a, b in zip(cut.heads, full.heads):
        assert (a.delta_loss, a.kl, a.direct_delta_loss) == approx((b.delta_loss, b.kl, b.direct_delta_loss),
                                                                   **size_of(lm))
        assert a.delta_accuracy == b.delta_accuracy
    site = find_heads(lm)[1]  # layer 1, head 2 removed by hand: o_proj's input slice zeroed, full logits
    n_units = float((ioi["labels"] != IGNORE).sum())

    def loss() -> float:
        with torch.no_grad():
            return float(score(lm(input_ids=ioi["input_ids"]).logits, ioi["labels"]).loss_sum.sum()) / n_units
    removed = with_head_weights_zeroed(site.out_proj.weight, 1, 2, site.head_dim, loss)
    head = next(h for h in cut.heads if (h.layer, h.head) == (1, 2))
    assert head.delta_loss == pytest.approx(removed - cut.baseline["loss"], abs=tol)


def test_plan_bounds_the_logits_that_are_made(lm, ioi):
    sites = find_heads(lm)
    one = {"input_ids": ioi["input_ids"][:1]}
    whole = footprint(lm, sites, one)
    kept = footprint(lm, sites, one, scored=ScoredOnly(output_layer(lm, sites)), index=torch.arange(2)[None])
    assert whole.logits == T * V * 4 and kept.logits == 2 * V * 4  # float32, 2 scored positions
    assert kept.layer == whole.layer < kept.logits  # the cache bound reads a layer's activations, not the logits
    batches = [({"input_ids": ioi["input_ids"]}, ioi["labels"])]
    plan = plan_sweep(lm, sites, batches, free=2 ** 40, scored=ScoredOnly(output_layer(lm, sites)), task="lm")
    assert (plan.micro_batch, plan.limited_by) == (N, "batch")
    assert plan.estimated_step_bytes == kept.step_bytes(plan.replication, N)


def test_most_positions_scored_keeps_every_logit(lm, ioi):
    data = {"input_ids": ioi["input_ids"][:4]}  # no labels: every next token is scored
    result = ablate_heads(lm, data, task="lm", progress=False, attention=False, direct=False)
    assert result.timing["logits"]["used"] is False and "positions are scored" in result.timing["logits"]["reason"]


def test_heads_closed_together_make_logits_at_the_scored_positions_only(lm, ioi):
    from diagnose import ablate_together

    sites, shapes = find_heads(lm), []
    hook = lm.get_output_embeddings().register_forward_hook(lambda m, args, out: shapes.append(tuple(out.shape)))
    try:
        group = ablate_together(lm, ioi, [(0, 1), (1, 2)], task="lm", batch_size=N)
    finally:
        hook.remove()
    assert shapes and all(s[1] <= 2 for s in shapes[-2:])  # the clean and the closed pass: 2 scored positions
    n_units = float((ioi["labels"] != IGNORE).sum())

    def loss() -> float:  # both heads removed by hand: o_proj's input slices zeroed, full logits
        with torch.no_grad():
            return float(score(lm(input_ids=ioi["input_ids"]).logits, ioi["labels"]).loss_sum.sum()) / n_units
    removed = with_head_weights_zeroed(sites[0].out_proj.weight, 1, 1, sites[0].head_dim,
                                       lambda: with_head_weights_zeroed(sites[1].out_proj.weight, 1, 2,
                                                                        sites[1].head_dim, loss))
    assert group.loss == pytest.approx(removed, abs=loss_tol(removed, **size_of(lm)))
