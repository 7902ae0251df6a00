"""Ground truth: on the demo's induction task, the heads that carry the planted copy mechanism
are the ones ablation ranks first, and removing them destroys accuracy; the rest are inert.

The mechanism is identified independently of ablation, from the attention maps: a head is a
copy head when, at the second copy of the sequence, it attends to the token after the
previous occurrence of the current token (the induction pattern), or a previous-token head
when it attends to the position before. (With the demo's fixed repeat offset the model can
reach the answer token by position in one layer, and it does: the induction pattern then
shows up in layer 0, four redundant heads strong, which this test allows.)
"""

from __future__ import annotations

import pytest
import torch

from diagnose import capture
from diagnose.ablation import ablate_heads, gated
from diagnose.demo import demo_variants
from diagnose.objectives import logits_of, score
from diagnose.sites import find_heads
from diagnose.zoo import Transformer, induction, train

HALF = 10


@pytest.fixture(scope="module")
def trained():
    variant = demo_variants(quick=True)[0]
    tr, ev = induction(n=3072, half=HALF, vocab_size=24).split(3072 - 512)
    torch.manual_seed(variant.train.seed)
    model = Transformer(variant.model)
    res = train(model, tr, variant.train, eval_data=ev)
    assert res.eval_accuracy > 0.95, "the demo induction model did not learn its task"
    return model.eval(), ev


def _mechanism_scores(model, ev):
    """Per head: induction-pattern, previous-token and first-token attention.  # each [L, H]"""
    ids = ev.input_ids[:128]  # [B, T]
    maps = torch.stack(capture(model, {"input_ids": ids}, activations=False).attention)  # [L, B, H, T, T]
    q = torch.arange(HALF + 1, 2 * HALF + 1)  # second copy: token q repeats token q - HALF
    answer = maps[:, :, :, q, q - HALF + 1].mean((1, 3))  # the token after the previous occurrence
    prev = maps[:, :, :, torch.arange(1, ids.shape[1]), torch.arange(0, ids.shape[1] - 1)].mean((1, 3))
    first = maps[:, :, :, q, 0].mean((1, 3))
    return answer, prev, first


def _accuracy_with_closed(model, ev, closed):
    sites = find_heads(model)
    inputs = {"input_ids": ev.input_ids, "attention_mask": ev.attention_mask}
    with torch.no_grad(), gated(sites) as gates:
        for g, site in zip(gates, sites):
            g.scale = torch.ones(len(ev), site.n_heads)  # [N, H]
            for layer, head in closed:
                if layer == site.layer:
                    g.scale[:, head] = 0.0
        return float(score(logits_of(model(**inputs)), ev.labels).accuracy)


@pytest.mark.slow
def test_ablation_finds_the_planted_mechanism(trained):
    model, ev = trained
    result = ablate_heads(model, ev.tensors(), task="lm", progress=False)
    answer, prev, first = _mechanism_scores(model, ev)
    heads = [(h.layer, h.head) for h in result.heads]
    mechanism = {(l, h) for l, h in heads if answer[l, h] > 0.5 or prev[l, h] > 0.5}
    others = set(heads) - mechanism
    assert mechanism and others

    # ablation ranks every mechanism head above every other head, and so does the fast estimate
    effect = {(h.layer, h.head): h.delta_loss for h in result.heads}
    assert min(effect[k] for k in mechanism) > max(effect[k] for k in others)
    top = max(result.heads, key=lambda h: h.grad_importance_raw)
    assert (top.layer, top.head) in mechanism
    assert result.correlations["fast_vs_exact"]["rho"] > 0.5

    # removing the mechanism destroys accuracy; removing everything else together does not
    assert result.baseline["accuracy"] > 0.95
    assert _accuracy_with_closed(model, ev, mechanism) < 0.5
    assert _accuracy_with_closed(model, ev, others) > 0.95

    # the other heads, those that park on the first token included, come out inert one by one
    for h in result.heads:
        if (h.layer, h.head) in others:
            assert abs(h.delta_accuracy) < 0.01 and not h.significant, (h.layer, h.head)
        if first[h.layer, h.head] > 0.5:
            assert (h.layer, h.head) in others
