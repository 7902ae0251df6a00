"""Positions: a model that sees no positions is found; any position signal, even weak, passes."""

from __future__ import annotations

import pytest
import torch

from diagnose.checks import check_model
from diagnose.zoo import ModelConfig, Transformer

from ..nano import NanoGPT
from ..tolerance import assert_close, size_of

pytestmark = pytest.mark.numerics


def _positions(model):
    return check_model(model, checks=["positions"])


@pytest.mark.parametrize("pooling", ["mean", "first"])
@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary"])
def test_classifiers_with_positions_pass(positions, pooling):
    # sinusoidal + first-token pooling at init is the weakest signal (~1e-4): float64 probing sees it
    assert list(_positions(Transformer(ModelConfig(kind="classifier", positions=positions, pooling=pooling)))) == []


@pytest.mark.parametrize("pooling", ["mean", "first"])
def test_classifier_without_positions_is_invariant(pooling):
    model = Transformer(ModelConfig(kind="classifier", positions="none", pooling=pooling))
    (f,) = _positions(model)
    assert f.severity == "warning" and "do not change" in f.title and f.evidence["per_position_outputs"] is False
    ids = torch.randint(1, 32, (2, 10))  # independent: swapping positions 3 and 7 changes nothing
    swapped = ids[:, [0, 1, 2, 7, 4, 5, 6, 3, 8, 9]]
    with torch.no_grad():
        assert_close(model.eval()(ids), model(swapped), **size_of(model))


def test_encoder_without_positions_is_equivariant():
    (f,) = _positions(Transformer(ModelConfig(kind="lm", causal=False, positions="none")))
    assert "merely permute" in f.title and f.evidence["per_position_outputs"] is True
    (g,) = _positions(NanoGPT(mask_offset=None, positions=False))
    assert g.severity == "warning"
    assert list(_positions(NanoGPT(mask_offset=None, positions=True))) == []


def test_causal_lm_without_positions_is_not_flagged():
    # the causal mask itself tells each position how many tokens precede it (Haviv et al. 2022)
    result = _positions(Transformer(ModelConfig(kind="lm", positions="none")))
    assert list(result) == [] and result.passed == ["positions"]
