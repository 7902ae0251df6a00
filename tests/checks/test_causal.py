"""Causal leak: broken masks are caught, correct ones pass, encoders are not called buggy."""

from __future__ import annotations

import pytest
import torch

from diagnose.checks import check_model
from diagnose.checks._causal import declared_causal
from diagnose.zoo import ModelConfig, Transformer

from ..nano import NanoGPT
from ..tolerance import changed, size_of

pytestmark = pytest.mark.numerics


def _causal(model, **kw):
    return [f for f in check_model(model, checks=["causal"], **kw)]


def _depends_on_later_token(model, t: int) -> bool:
    """Independent of the check: does the output at t change when only token t + 1 changes?"""
    ids = torch.randint(1, 50, (1, 12))  # [1, T]
    other = ids.clone()
    other[0, t + 1] = (ids[0, t + 1] % 49) + 1
    with torch.no_grad():
        a, b = model.eval()(ids), model(other)
    return changed(a[0, t], b[0, t], **size_of(model))  # neither close nor clearly apart: fails


def test_correct_reference_lm_passes():
    result = check_model(Transformer(ModelConfig(kind="lm")), checks=["causal"])
    assert list(result) == [] and result.passed == ["causal"]


def test_mask_filled_with_zero_is_a_causal_leak():
    (f,) = _causal(Transformer(ModelConfig(kind="lm", mask_fill="zero")))
    assert f.severity == "error" and f.evidence["declared_causal"] is True
    assert f.evidence["max_relative_change_later_tokens"] > 1e-2
    assert "-inf" in f.fix


@pytest.mark.parametrize("offset", [2, 0, None])
def test_broken_nanogpt_masks_are_errors_when_causal_is_asked(offset):
    model = NanoGPT(mask_offset=offset)
    assert _depends_on_later_token(model, 0)  # the planted bug is real
    (f,) = _causal(model, causal=True)
    assert f.severity == "error"
    assert f.evidence["first_leaking_position"] == 0
    assert f.evidence["positions_leaking"] >= 1


def test_off_by_one_in_one_layer_is_named():
    (f,) = _causal(NanoGPT(mask_offset=2, n_layers=1), causal=True)
    assert "next token" in f.title and f.evidence["max_relative_change_later_tokens"] <= 1e-4
    assert f.evidence["max_relative_change_next_token"] > 1e-3


def test_correct_nanogpt_passes_with_and_without_sdpa():
    for scale in ("sqrt", "sdpa"):
        model = NanoGPT(mask_offset=1, scale=scale)
        assert not _depends_on_later_token(model, 3)
        assert _causal(model, causal=True) == []


def test_undeclared_lm_without_mask_is_a_warning_saying_how_to_declare_intent():
    (f,) = _causal(NanoGPT(mask_offset=None))  # per-position logits over its own vocabulary, nothing declared
    assert f.severity == "warning" and f.evidence["lm_shaped_outputs"] is True
    assert "--causal" in f.fix and "--bidirectional" in f.fix and "causal=False" in f.fix


def test_declared_bidirectional_model_is_information_not_a_bug():
    result = check_model(Transformer(ModelConfig(kind="lm", causal=False)), checks=["causal"])
    assert [x.severity for x in result] == ["info"] and result.passed == ["causal"]
    model = NanoGPT(mask_offset=None)
    model.is_causal = False  # the Python declaration on a hand-written model
    (f,) = _causal(model)
    assert f.severity == "info" and "bidirectional" in f.title
    model.is_causal = True
    assert _causal(model)[0].severity == "error"


def test_undeclared_leak_on_non_lm_outputs_stays_information():
    model = NanoGPT(mask_offset=None)
    model.lm_head = torch.nn.Linear(32, 7)  # per-position tags, not a vocabulary: an encoder's tagger
    (f,) = _causal(model)
    assert f.severity == "info" and f.evidence["lm_shaped_outputs"] is False


def test_declared_causal_module_makes_a_leak_an_error():
    model = NanoGPT(mask_offset=None)
    model.h[0].attn.is_causal = True  # the Hugging Face convention
    assert declared_causal(model) is True
    (f,) = _causal(model)
    assert f.severity == "error"


def test_causal_false_skips_and_pooled_outputs_skip():
    result = check_model(Transformer(ModelConfig(kind="lm")), checks=["causal"], causal=False)
    assert result.skipped[0]["check"] == "causal" and "causal=False" in result.skipped[0]["why"]
    result = check_model(Transformer(ModelConfig(kind="classifier")), checks=["causal"])
    assert "pooled" in result.skipped[0]["why"] and list(result) == []
