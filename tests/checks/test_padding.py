"""Padding leak: a missing padding mask and a mask filled with 0 are caught, correct masks pass."""

from __future__ import annotations

import pytest
import torch

from diagnose.checks import check_model
from diagnose.zoo import ModelConfig, Transformer

from ..nano import NanoGPT, NanoNoMask
from ..tolerance import assert_differ, size_of

pytestmark = pytest.mark.numerics


def _padding(model):
    return check_model(model, checks=["padding"])


@pytest.mark.parametrize("kind", ["lm", "classifier"])
@pytest.mark.parametrize("fill", ["large", "-inf"])
def test_correct_masks_pass(kind, fill):
    result = _padding(Transformer(ModelConfig(kind=kind, mask_fill=fill)))
    assert list(result) == [] and result.passed == ["padding"]


@pytest.mark.parametrize("kind", ["lm", "classifier"])
def test_mask_filled_with_zero_leaks(kind):
    model = Transformer(ModelConfig(kind=kind, mask_fill="zero"))
    (f,) = _padding(model)
    assert f.severity == "error" and "padding content" in f.title and "padding length" in f.title
    # independent: the real positions' output depends on what the padded position holds
    ids = torch.tensor([[3, 4, 5, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    with torch.no_grad():
        a = model.eval()(ids, mask)
        b = model(torch.tensor([[3, 4, 5, 7, 9]]), mask)
    assert_differ(a if kind == "classifier" else a[:, :3], b if kind == "classifier" else b[:, :3], **size_of(model))
    mass = f.evidence["attention_mass_on_padding_per_layer"]
    assert len(mass) == 2 and min(mass) > 0.05  # exp(0) keeps weight on padded keys


def test_missing_padding_mask_in_a_classifier():
    (f,) = _padding(NanoGPT(mask_offset=None, use_padding=False, pooled=3))
    assert f.severity == "error" and f.evidence["max_relative_change_content_right"] > 1e-2
    assert _padding(NanoGPT(mask_offset=None, use_padding=True, pooled=3)) == []


def test_missing_padding_mask_in_a_causal_lm_shows_with_left_padding():
    # right padding sits after every real token, so the causal mask already hides it
    (f,) = _padding(NanoGPT(mask_offset=1, use_padding=False))
    assert f.evidence["max_relative_change_content_right"] <= 1e-4
    assert f.evidence["max_relative_change_content_left"] > 1e-2
    assert max(f.evidence["attention_mass_on_padding_per_layer"]) > 0.05


def test_model_without_attention_mask_is_skipped():
    result = _padding(NanoNoMask())
    assert list(result) == [] and result.passed == []
    assert "attention_mask" in result.skipped[0]["why"]
