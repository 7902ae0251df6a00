"""The convention matrix: one hand-written decoder in every masking and scaling convention of
other people's code (tests/conventions.py), correct and with each classic bug, plus library models
that use those conventions. Every correct variant passes every check (none skipped but the
padding check of a forward without attention_mask); every bug is found by its check and by no other.
"""

from __future__ import annotations

import math

import pytest
import torch

from diagnose import check_model

from ..conventions import EXPLICIT, SCALES, SDPA, conv_lm
from ..tolerance import approx

pytestmark = pytest.mark.numerics

ALL = ["causal", "padding", "scaling", "positions"]
# bug -> the checks that must flag it (a 0 fill breaks the causal and the padding mask alike)
FINDS = {"unscaled": ["scaling"], "no_causal": ["causal"], "off_by_one": ["causal"],
         "pad_ignored": ["padding"], "zero_fill": ["causal", "padding"]}


def _bugs(mask: str) -> list[str]:
    if mask == "sdpa_causal":  # is_causal=True has no mask tensor to fill or to pad
        return ["unscaled", "no_causal"]
    return [b for b in FINDS if not (mask == "sdpa_bool" and b == "zero_fill")]


def _run(model):
    torch.manual_seed(0)
    return check_model(model, causal=True)


def _expected_passed(mask: str) -> list[str]:
    return [c for c in ALL if not (mask == "sdpa_causal" and c == "padding")]  # forward(idx): no padding


@pytest.mark.slow
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("mask", EXPLICIT)
def test_every_correct_explicit_softmax_convention_passes(mask, scale):
    result = _run(conv_lm(mask, scale))
    assert list(result) == [], [(f.check, f.title) for f in result]
    assert result.passed == ALL, result.skipped


@pytest.mark.parametrize("mask", SDPA)
def test_every_correct_sdpa_convention_passes(mask):
    result = _run(conv_lm(mask))
    assert list(result) == [] and result.passed == _expected_passed(mask), result.skipped


@pytest.mark.slow
@pytest.mark.parametrize("mask,bug", [(m, b) for m in EXPLICIT + SDPA for b in _bugs(m)])
def test_every_bug_is_found_by_its_check_only(mask, bug):
    result = _run(conv_lm(mask, "div", bug))
    assert sorted({f.check for f in result.problems}) == FINDS[bug], [(f.check, f.title) for f in result]
    # measured, not guessed: unscaled is exactly sqrt(d_k) too large (d 32, 2 heads: D = 16)
    scales = [f.evidence["scale_times_sqrt_dk_per_layer"] for f in result.problems if f.check == "scaling"]
    assert scales == ([approx([4.0, 4.0], width=16)] if bug == "unscaled" else [])
    assert not [s for s in result.skipped if s["check"] in FINDS[bug]]


@pytest.mark.parametrize("fill", ["1e9", "1e4"])
def test_finite_fill_measures_the_scale_instead_of_skipping(fill):
    """-1e9 / -1e4 fills are below no fixed score threshold; the common ratio still finds the scale."""
    good = check_model(conv_lm(fill, "div"), checks=["scaling"])
    assert good.passed == ["scaling"] and not good.skipped
    (f,) = check_model(conv_lm(fill, "div", "unscaled"), checks=["scaling"])
    assert f.evidence["scale_times_sqrt_dk_per_layer"][0] == approx(math.sqrt(16), width=16)


def test_in_place_division_is_not_mistaken_for_no_scaling():
    """`s /= c` changes the q @ k^T product the check saw; it keeps a copy, so the scale is 1/sqrt(D)."""
    result = check_model(conv_lm("additive", "idiv"), checks=["scaling"])
    assert list(result) == [] and result.passed == ["scaling"]


transformers = pytest.importorskip("transformers")


def _falcon():
    cfg = transformers.FalconConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    alibi=False, new_decoder_architecture=False, multi_query=False,
                                    attn_implementation="eager", bos_token_id=1, eos_token_id=2)
    return transformers.FalconForCausalLM(cfg)


def test_falcon_eager_divides_in_place_and_passes():
    model = _falcon()
    result = check_model(model)
    assert list(result) == [], [(f.check, f.title) for f in result]
    assert result.passed == ALL
