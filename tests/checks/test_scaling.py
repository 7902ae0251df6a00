"""Scaling: the measured scale is exactly 1/sqrt(d_k) on correct models and sqrt(d_k) larger without it."""

from __future__ import annotations

import math

import pytest
import torch

from diagnose.checks import check_model
from diagnose.zoo import ModelConfig, Transformer

from ..nano import NanoGPT
from ..tolerance import approx

pytestmark = pytest.mark.numerics


def _scaling(model, data=None):
    return check_model(model, data, checks=["scaling"])


@pytest.mark.parametrize("positions", ["learned", "rotary"])
@pytest.mark.parametrize("kind", ["lm", "classifier"])
def test_reference_with_scale_passes(kind, positions):
    result = _scaling(Transformer(ModelConfig(kind=kind, positions=positions)))
    assert list(result) == [] and result.passed == ["scaling"]


@pytest.mark.parametrize("d_model,n_heads", [(64, 4), (64, 1)])
def test_reference_without_scale_is_found(d_model, n_heads):
    model = Transformer(ModelConfig(attn_scale="none", d_model=d_model, n_heads=n_heads))
    (f,) = _scaling(model)
    D = d_model // n_heads
    assert f.severity == "warning" and "not divided by sqrt(d_k)" in f.title
    assert f.evidence["scale_times_sqrt_dk_per_layer"] == approx([math.sqrt(D)] * 2, width=D)
    assert f.evidence["layers"] == [0, 1]


def test_logit_std_matches_scores_computed_by_hand():
    model = Transformer(ModelConfig(attn_scale="none", init_std=0.2)).eval()
    ids = torch.randint(1, 32, (8, 16))  # [B, T]
    (f,) = _scaling(model, ids)
    with torch.no_grad():  # layer 0 scores, computed from the weights without the check's machinery
        x = model.tok_emb(ids) + model.pos_emb(torch.arange(16))
        attn = model.blocks[0].attn
        q, k, _ = attn.qkv(model.blocks[0].ln1(x)).split(64, dim=2)
        q, k = (t.view(8, 16, 4, 16).transpose(1, 2) for t in (q, k))  # [B, H, T, D]
        scores = q @ k.transpose(-2, -1)  # [B, H, T, T], unscaled as configured
        stds = [scores[b, h, t, : t + 1].std() for b in range(8) for h in range(4) for t in range(1, 16)]
    assert f.evidence["logit_std_per_layer"][0] == approx(float(torch.stack(stds).median()), width=16 * 16)


@pytest.mark.parametrize("scale", ["sqrt", "folded", "sdpa"])
def test_hand_written_correct_variants_pass(scale):
    assert list(_scaling(NanoGPT(scale=scale))) == []


def test_hand_written_unscaled_is_found_and_inverse_d_is_information():
    (f,) = _scaling(NanoGPT(scale="none"))  # d 32, 4 heads: D = 8
    assert f.severity == "warning" and f.evidence["scale_times_sqrt_dk_per_layer"][0] == approx(math.sqrt(8))
    (g,) = _scaling(NanoGPT(scale="inverse_d"))
    assert g.severity == "info" and g.evidence["scale_times_sqrt_dk_per_layer"][0] == approx(1 / math.sqrt(8), scale=1.0)


def test_saturated_attention_is_information_only():
    model = Transformer(ModelConfig(kind="classifier"))
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(100.0)  # huge q and k: near one-hot rows, scale still correct
    result = _scaling(model)
    assert [f.severity for f in result] == ["info"] and result.passed == ["scaling"]
    assert min(result[0].evidence["saturated_share_per_layer"]) > 0.5


def test_model_without_attention_is_skipped():
    model = torch.nn.Sequential(torch.nn.Embedding(20, 8), torch.nn.Linear(8, 20))
    result = _scaling(model)
    assert result.skipped and result.skipped[0]["check"] == "scaling" and list(result) == []
