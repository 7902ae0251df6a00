"""prune_heads on the reference model: the pruned copy equals the original with the removed heads'
output-projection slices zeroed, layers may go down to no heads, and the checkpoint reloads."""

from __future__ import annotations

import pytest
import torch

import diagnose
from diagnose.io import load_model
from diagnose.sites import find_heads
from diagnose.zoo import ModelConfig, Transformer

from ..tolerance import F64, approx, assert_exact, loss_tol, tol
from .helpers import assert_close, evaluate, outputs, size, state_hash, zeroed

pytestmark = pytest.mark.numerics


def _model_and_data(kind="classifier"):
    torch.manual_seed(0)
    cfg = ModelConfig(kind=kind, n_layers=2, n_heads=4, d_model=32, vocab_size=24, max_len=16, init_std=0.2)
    model = Transformer(cfg).eval()
    ids = torch.randint(1, 24, (24, 8), generator=torch.Generator().manual_seed(1))
    data = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if kind == "classifier":
        data["labels"] = outputs(model, {"input_ids": ids}).argmax(-1)  # the model is right on every example
    return model, data


def test_prunes_to_empty_layers_and_matches_the_zeroed_model(tmp_path):
    model, data = _model_and_data()
    before = state_hash(model)
    result = diagnose.prune_heads(model, data, max_drop=100.0, eval_data=data)
    assert state_hash(model) == before and not model._forward_pre_hooks  # the input is untouched
    assert result.heads_left == [0, 0] and len(result.order) == 8  # a budget of 100 points lets every head go
    assert result.stop.reason.startswith("every layer is down to 0")
    sites = find_heads(model)
    reference = zeroed(model, sites, result.removed)
    inputs = {k: v for k, v in data.items() if k != "labels"}
    assert_close(outputs(result.model, inputs), outputs(reference, inputs), sites)
    blocks = result.model.blocks
    assert all(b.attn.qkv.weight.shape[0] == 0 and b.attn.proj.weight.shape[1] == 0 for b in blocks)
    assert result.size.parameters_after < result.size.parameters_before
    assert any("bias" in note for note in result.notes)
    result.save_pretrained(tmp_path / "out")
    again = load_model(tmp_path / "out" / "model.pt")
    assert again.cfg.layer_heads == [0, 0]
    assert_exact(outputs(again, inputs), outputs(result.model, inputs))  # a reload computes the same


def test_budget_is_kept_and_the_curve_is_monotone_in_removals():
    model, data = _model_and_data()
    result = diagnose.prune_heads(model, data, max_drop=10.0)
    d = result.to_json()
    base = d["baseline"]["accuracy"]
    assert d["schema"] == "diagnose.prune/1" and d["curve"][0]["n_removed"] == 0
    assert [p["n_removed"] for p in d["curve"]] == list(range(len(d["curve"])))
    assert all(base - p["accuracy"] <= 0.10 + tol(1.0, dtype=F64) for p in d["curve"])  # never past the budget
    assert d["stop"]["reason"].startswith("removing one more")  # on this model the budget, not the heads, runs out
    assert base - d["stop"]["next"]["accuracy"] > 0.10  # the head it refused would have broken it
    assert sum(d["heads_left"]) == 8 - d["n_removed"]
    assert d["verify"]["passed"]


def test_mean_method_folds_the_means_into_the_bias():
    model, data = _model_and_data(kind="lm")
    result = diagnose.prune_heads(model, data, max_loss=10.0, method="mean", limit=3)
    assert result.task == "lm" and len(result.order) == 3
    assert result.verify.passed and result.verify.max_abs_diff <= result.verify.tolerance


def test_every_point_of_the_curve_is_measured_with_the_earlier_removals_in_place():
    """Re-measuring after each removal: point k equals the model with the first k heads zeroed by
    hand (not the sum of single-head effects), so a pair that matters only together shows its cost."""
    model, data = _model_and_data()
    result = diagnose.prune_heads(model, data, max_drop=100.0, limit=5, candidates=2)
    sites = find_heads(model)
    batches = [({"input_ids": data["input_ids"], "attention_mask": data["attention_mask"]}, data["labels"])]
    removed = result.removed
    for k, point in enumerate(result.curve):
        acc, loss = evaluate(zeroed(model, sites, removed[:k]), batches, "classification")
        assert point.accuracy == approx(acc, scale=1.0, dtype=F64)  # exact counts over float64
        assert point.loss == pytest.approx(loss, abs=loss_tol(loss, **size(sites)))


def test_a_config_and_keywords_are_the_same_call():
    """prune_heads reads task, method and batch_size from ablate_heads' AblationConfig or its keywords."""
    from diagnose.ablation import AblationConfig
    from diagnose.errors import ConfigError, UsageError

    model, data = _model_and_data()
    by_keywords = diagnose.prune_heads(model, data, max_drop=10.0, task="classification", method="mean", batch_size=8)
    by_config = diagnose.prune_heads(model, data, max_drop=10.0,
                                     config=AblationConfig(task="classification", method="mean", batch_size=8))
    assert by_config.method == by_keywords.method == "mean" and by_config.removed == by_keywords.removed
    assert by_config.to_json()["curve"] == by_keywords.to_json()["curve"]
    with pytest.raises(ConfigError, match="cannot be folded"):
        diagnose.prune_heads(model, data, config=AblationConfig(method="resample"))
    with pytest.raises(UsageError, match="prune_heads.. got an unexpected keyword argument 'fast'"):
        diagnose.prune_heads(model, data, fast=True)
