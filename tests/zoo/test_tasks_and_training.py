"""Synthetic tasks are deterministic and hold their planted structure; the trainer learns them."""

from __future__ import annotations

import pytest
import torch

from diagnose.zoo import ModelConfig, TrainConfig, Transformer, induction, order, padded_majority, train
from diagnose.zoo.train import lr_factor
from ..tolerance import F64, approx

pytestmark = pytest.mark.numerics


def test_tasks_are_deterministic_from_seed():
    for make in (induction, order, padded_majority):
        a, b, c = make(seed=1), make(seed=1), make(seed=2)
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
        assert not torch.equal(a.input_ids, c.input_ids)


def test_induction_repeats_a_segment_with_a_random_period():
    d = induction(n=64, length=20, min_period=3, max_period=7)
    ids, periods = d.input_ids, d.meta["periods"]
    assert (ids[:, 0] == 0).all() and len(set(periods.tolist())) > 2
    for i in range(64):
        p = int(periods[i])
        body = ids[i, 1:]
        assert torch.equal(body[p:], body[:-p])  # a repeat with period p
        assert len(set(body[:p].tolist())) == p  # distinct tokens: one previous occurrence each
        scored = (d.labels[i] != -100).nonzero().flatten()
        assert scored.tolist() == list(range(p + 1, 20))  # from the second occurrence on
        assert torch.equal(d.labels[i, scored], ids[i, scored + 1])
    tr, ev = d.split(50)
    assert torch.equal(ev.meta["periods"], periods[50:])


def test_order_task_is_invisible_to_a_permutation_invariant_reader():
    d = order(n=2000)
    # The label flips when the first and last tokens swap; the multiset is unchanged.
    swapped = d.input_ids.clone()
    swapped[:, [0, -1]] = swapped[:, [-1, 0]]
    assert ((swapped[:, 0] > swapped[:, -1]).long() != d.labels).all()
    assert 0.4 < d.labels.float().mean() < 0.6


def test_padding_task_labels_count_only_real_tokens():
    d = padded_majority(n=500)
    real = d.attention_mask == 1
    ones = ((d.input_ids == 1) & real).sum(1)
    twos = ((d.input_ids == 2) & real).sum(1)
    assert torch.equal((ones > twos).long(), d.labels)
    assert (d.input_ids[~real] == 0).all() and len(set(real.sum(1).tolist())) > 5


def test_warmup_schedule():
    cfg = TrainConfig(steps=100, warmup=10, min_lr_ratio=0.1)
    assert lr_factor(0, cfg) == 0.1 and lr_factor(9, cfg) == 1.0
    assert lr_factor(99, cfg) == approx(1 - 0.9 * 89 / 90, dtype=F64)
    assert lr_factor(0, TrainConfig(warmup=0)) == 1.0


@pytest.mark.slow
def test_trainer_learns_the_order_task():
    data = order(n=2048)
    tr, ev = data.split(1536)
    model = Transformer(ModelConfig(kind="classifier", vocab_size=16, max_len=8, n_layers=2, d_model=64))
    res = train(model, tr, TrainConfig(steps=300), eval_data=ev)
    assert res.eval_accuracy > 0.95, res.eval_accuracy


def test_without_positions_order_task_stays_at_chance():
    data = order(n=2048)
    tr, ev = data.split(1536)
    model = Transformer(ModelConfig(kind="classifier", vocab_size=16, max_len=8, positions="none"))
    res = train(model, tr, TrainConfig(steps=150), eval_data=ev)
    assert res.eval_accuracy < 0.65, res.eval_accuracy
