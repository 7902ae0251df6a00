"""Closing a group of heads at once, against the same model with those heads' output-projection
slices zeroed; and the backup question it exists to answer."""

from __future__ import annotations

import pytest
import torch

from diagnose import ablate_heads, ablate_together
from diagnose.ablation.batches import as_batches
from diagnose.ablation import AblationConfig
from diagnose.errors import ConfigError, UsageError
from diagnose.zoo import ModelConfig, Transformer, order

from .helpers import assert_untouched, evaluate, loss_tol, snapshot, with_head_weights_zeroed
from ..tolerance import F64, approx, assert_differ, size_of

pytestmark = pytest.mark.numerics


@pytest.fixture(scope="module")
def model_and_data():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(kind="classifier", vocab_size=16, max_len=8, n_layers=2, n_heads=4,
                                    d_model=32)).eval()
    for p in model.parameters():  # a random model with large weights: every head moves the output
        p.data.mul_(8.0)
    return model, order(n=96, seed=3).tensors()


def _zeroed(model, data, closed):
    """Accuracy and loss with each closed head's input columns of attn.proj zeroed (no gate):
    one weight-zeroing per head, nested, the model run innermost."""
    if not closed:
        return evaluate(model, as_batches(data, 32), "classification")
    (layer, head), rest = closed[0], closed[1:]
    return with_head_weights_zeroed(model.blocks[layer].attn.proj.weight, 1, head, model.cfg.head_dim,
                                    lambda: _zeroed(model, data, rest))


@pytest.mark.parametrize("closed", [[(0, 1)], [(0, 1), (1, 2)], [(0, 0), (0, 3), (1, 1)]])
def test_group_equals_weight_zeroing(model_and_data, closed):
    model, data = model_and_data
    before = snapshot(model)
    got = ablate_together(model, data, closed, task="classification", batch_size=32)
    acc, loss = _zeroed(model, data, closed)
    clean_acc, clean_loss = evaluate(model, as_batches(data, 32), "classification")
    assert got.accuracy == approx(acc, scale=1.0, dtype=F64) and got.loss == approx(loss, **size_of(model))
    assert got.baseline_accuracy == approx(clean_acc, scale=1.0, dtype=F64)
    assert got.baseline_loss == approx(clean_loss, **size_of(model))
    assert_differ(got.delta_loss, 0.0, scale=max(1.0, got.baseline_loss), **size_of(model))  # the heads move it
    assert got.heads == sorted(closed) and got.to_json()["delta_loss"] == got.delta_loss  # the same float, written out
    assert_untouched(model, before)


def test_one_head_matches_the_sweep(model_and_data):
    model, data = model_and_data
    sweep = ablate_heads(model, data, task="classification", progress=False, attention=False, batch_size=32)
    for h in sweep.heads[:3]:
        one = ablate_together(model, data, [(h.layer, h.head)], task="classification", batch_size=32)
        assert one.delta_loss == pytest.approx(h.delta_loss, abs=loss_tol(one.loss, one.baseline_loss, **size_of(model)))
        assert one.delta_accuracy == approx(h.delta_accuracy, scale=1.0, dtype=F64)


def test_mean_ablation_of_nothing_and_bad_heads(model_and_data):
    model, data = model_and_data
    none = ablate_together(model, data, [], task="classification", method="mean")
    assert none.delta_loss == 0.0 and none.delta_accuracy == 0.0
    mean = ablate_together(model, data, [(0, 2)], task="classification", method="mean")
    zero = ablate_together(model, data, [(0, 2)], task="classification", method="zero")
    assert_differ(mean.loss, zero.loss, **size_of(model))  # the mean is a different replacement
    with pytest.raises(ConfigError, match="no head 4 in layer 0"):
        ablate_together(model, data, [(0, 4)], task="classification")
    with pytest.raises(ConfigError, match="no head 0 in layer 7"):
        ablate_together(model, data, [(7, 0)], task="classification")
    with pytest.raises(ConfigError, match="method"):
        ablate_together(model, data, [(0, 0)], task="classification", method="nonesuch")  # resample is one now


def test_a_config_and_keywords_are_the_same_call(model_and_data):
    """ablate_together takes ablate_heads' AblationConfig; its keywords lay over it; other options are refused."""
    model, data = model_and_data
    by_keywords = ablate_together(model, data, [(0, 2)], task="classification", method="mean", batch_size=32)
    config = AblationConfig(task="classification", method="mean", batch_size=32, alpha=0.01)
    assert ablate_together(model, data, [(0, 2)], config=config).to_json() == by_keywords.to_json()
    zero = ablate_together(model, data, [(0, 2)], config=config, method="zero")  # a keyword wins over the config
    assert zero.method == "zero" and zero.to_json() == ablate_together(model, data, [(0, 2)], batch_size=32).to_json()
    with pytest.raises(UsageError, match="ablate_together.. got an unexpected keyword argument 'alpha'"):
        ablate_together(model, data, [(0, 2)], alpha=0.01)
