"""Ground truth: on the demo's induction task, the heads that carry the planted copy mechanism
are the ones ablation ranks first, and removing them destroys accuracy; the rest are inert.

The mechanism is identified independently of ablation, from the attention maps, at the
positions where the next token is predictable: a previous-token head attends to the position
before the query; an induction head attends to the token after the previous occurrence of the
query's token (the period varies per example, so no positional offset does this). The demo
model has two heads a layer: a single redundant copy would hide behind its twin.
"""

from __future__ import annotations

import pytest
import torch

from diagnose import capture
from diagnose.ablation import ablate_heads, ablate_together
from diagnose.demo import demo_variants, shipped_variant
from ..tolerance import F64, approx

pytestmark = pytest.mark.numerics


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The demo's own induction model as the demo ablates it: shipped trained (hash-checked), not
    retrained here (a minute of this CPU for each pass of CI), and evaluated on its held-out split."""
    t = shipped_variant(demo_variants()[0], tmp_path_factory.mktemp("runs"), {})
    assert t.accuracy > 0.95, "the demo induction model does not do its task"
    return t.model.eval(), t.eval_data


def _mechanism_scores(model, ev):
    """Per head: induction-pattern and previous-token attention.  # each [L, H]"""
    n = 128
    ids, periods = ev.input_ids[:n], ev.meta["periods"][:n]  # [B, T], [B]
    maps = torch.stack(capture(model, {"input_ids": ids}, activations=False).attention)  # [L, B, H, T, T]
    maps = maps.permute(1, 3, 4, 0, 2)  # [B, Tq, Tk, L, H]
    b, q = (ev.labels[:n] != -100).nonzero(as_tuple=True)  # predictable (example, query) pairs
    answer = maps[b, q, q - periods[b] + 1].mean(0)  # the token after the previous occurrence  # [L, H]
    prev = maps[b, q, q - 1].mean(0)
    return answer, prev


def _accuracy_with_closed(model, ev, closed):
    return ablate_together(model, ev.tensors(), closed, task="lm").accuracy


@pytest.mark.slow
def test_ablation_finds_the_planted_mechanism(trained):
    model, ev = trained
    result = ablate_heads(model, ev.tensors(), task="lm", progress=False)
    answer, prev = _mechanism_scores(model, ev)
    effect = {(h.layer, h.head): h for h in result.heads}
    assert result.baseline["accuracy"] > 0.95

    # layer 1 holds the induction heads: each attends to the token after the previous occurrence
    # far above chance (1/T ~ 0.05); the two copy together, so closing both destroys accuracy
    induction_heads = {(1, h) for h in range(answer.shape[1]) if answer[1, h] > 0.3}
    assert induction_heads == {(1, 0), (1, 1)}, answer
    assert _accuracy_with_closed(model, ev, induction_heads) < 0.5
    # ... and the sweep finds that on its own: the look-alike pair is closed together and flagged
    (group,) = [f for f in result.flags if f["kind"] == "redundant_group"]
    assert {tuple(m) for m in group["heads"]} == induction_heads and "back each other up" in group["reason"]
    assert group["together"]["accuracy"] == approx(_accuracy_with_closed(model, ev, induction_heads), dtype=F64)  # counts

    # the head ablation ranks first is layer 0's previous-token head, the one the induction
    # heads read; removing it alone destroys accuracy
    top = max(result.heads, key=lambda h: h.delta_loss)
    assert top.layer == 0 and prev[0, top.head] == prev[0].max()
    assert top.significant and top.delta_accuracy < -0.3
    by_gradient = max(result.heads, key=lambda h: h.grad_importance_raw)
    assert (by_gradient.layer, by_gradient.head) == (top.layer, top.head)

    # the rest of layer 0 carries nothing: inert one by one, and closed together with nothing lost
    others = {(0, h) for h in range(answer.shape[1]) if h != top.head}
    assert _accuracy_with_closed(model, ev, others) > 0.95
    for key in others:  # tiny beside the top head (a powerful loss test may still call a tiny effect real)
        assert abs(effect[key].delta_accuracy) < 0.01 and effect[key].delta_loss < 0.01 * top.delta_loss, key
