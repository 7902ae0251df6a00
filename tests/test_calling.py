"""diagnose.calling: one way to call a model, read from its forward's signature."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from diagnose import UsageError, check_model
from diagnose.notes import Note
from diagnose.calling import (call, call_arguments, convention, last_position_batch, last_position_only, logits,
                              per_position, use_forward)
from .nano import NanoGPT, NanoNoMask
from .tolerance import approx, assert_close, assert_exact

pytestmark = pytest.mark.numerics


class Recorder(nn.Module):
    """Records what its forward received: forward(x, *, mask=None, **kwargs), as x-transformers'."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(1, 1)
        self.got: dict = {}

    def forward(self, x, return_embeddings=False, mask=None, **kwargs):
        self.got = {"x": x, "mask": mask, **kwargs}
        return x.float()[..., None]


class TakesPixels(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):  # [B, 3, H, W] -> [B, 2]
        return self.lin(x.mean((2, 3)))


def test_nanogpt_style_forward_takes_the_ids_positionally_and_drops_an_all_ones_mask():
    torch.manual_seed(0)
    model = NanoNoMask(vocab=20, d=8, n_heads=2, max_len=8).eval()
    ids = torch.randint(0, 20, (2, 6))
    args, kwargs = call_arguments(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    assert args[0] is ids and kwargs == {}
    assert_exact(call(model, {"input_ids": ids}), model(ids))


def test_a_mask_the_forward_cannot_take_is_dropped_with_one_warning():
    model = NanoNoMask(vocab=20, d=8, n_heads=2, max_len=8).eval()
    ids = torch.randint(0, 20, (2, 6))
    mask = torch.ones_like(ids)
    mask[0, -1] = 0
    with pytest.warns(Note, match="takes no padding mask"):
        call(model, {"input_ids": ids, "attention_mask": mask})


def test_hugging_face_style_keywords_are_passed_by_name():
    model = NanoGPT(vocab=20, d=8, n_heads=2, max_len=8).eval()
    ids = torch.randint(0, 20, (2, 6))
    mask = torch.ones_like(ids)
    args, kwargs = call_arguments(model, {"input_ids": ids, "attention_mask": mask})
    assert args == () and set(kwargs) == {"input_ids", "attention_mask"}


def test_x_transformers_style_forward_gets_x_positionally_and_the_mask_as_bool_mask():
    model = Recorder()
    ids = torch.arange(6).view(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    call(model, {"input_ids": ids, "attention_mask": mask})
    assert model.got["x"] is ids
    assert model.got["mask"].dtype == torch.bool
    assert model.got["mask"].tolist() == [[True, True, False], [True, True, True]]


def test_pixel_values_go_to_the_first_parameter():
    model = TakesPixels()
    x = torch.randn(2, 3, 4, 4)
    assert_exact(call(model, {"pixel_values": x}), model(x))
    assert convention(model).first == "x"


def test_a_model_that_cannot_be_called_names_its_signature_and_the_fix():
    class TwoInputs(nn.Module):
        def forward(self, a, b):
            return a

    with pytest.raises(UsageError, match=r"TwoInputs\.forward\(a, b\).*forward=") as err:
        call(TwoInputs(), {"input_ids": torch.zeros(1, 2, dtype=torch.long)})
    assert "\n" not in str(err.value)


def test_use_forward_replaces_the_inferred_call():
    model = NanoNoMask(vocab=20, d=8, n_heads=2, max_len=8).eval()
    ids = torch.randint(0, 20, (2, 6))
    use_forward(model, lambda m, inputs: (m(inputs["tokens"]), None))
    assert_exact(logits(call(model, {"tokens": ids})), model(ids))
    use_forward(model, None)
    with pytest.raises(UsageError, match="forward"):
        call(model, {"input_ids": ids, "tokens": ids})


def test_logits_are_read_from_a_logits_loss_pair_and_last_position_outputs_are_recognised():
    out = torch.randn(2, 1, 5)
    assert logits((out, None)) is out
    ids = torch.zeros(2, 4, dtype=torch.long)
    assert last_position_only(out, {"input_ids": ids})
    assert not last_position_only(torch.randn(2, 4, 5), ids)
    assert not last_position_only(torch.randn(2, 1, 5), ids[:, :1])


def test_last_position_batch_scores_the_token_after_the_last_input():
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    cut, target = last_position_batch({"input_ids": ids, "attention_mask": mask}, None)
    assert cut["input_ids"].tolist() == [[1, 2, 3], [5, 6, 7]]
    assert cut["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 1]]
    assert target.tolist() == [[-100], [8]]


class LastPosition(NanoNoMask):
    """nanoGPT's convention: forward(idx, targets=None) -> (logits, loss), the last position only
    without targets (its lm_head reads the final norm's last row)."""

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x, None)
        x = self.ln_f(x)
        return (self.lm_head(x[:, [-1], :]), None) if targets is None else (self.lm_head(x), 0.0)


def test_per_position_reads_a_last_position_model_at_every_position_from_its_final_norm():
    torch.manual_seed(0)
    model = LastPosition(vocab=20, d=8, n_heads=2, max_len=8).eval()
    ids = torch.randint(0, 20, (2, 6))
    with pytest.warns(Note, match="read from 'ln_f'"):
        got = per_position(model, {"input_ids": ids})
    x = model.wte(ids) + model.wpe(torch.arange(6))
    for block in model.h:
        x = block(x, None)
    assert_exact(got, model.ln_f(x))


def test_the_causal_check_tests_a_last_position_model():
    torch.manual_seed(0)
    leaky = LastPosition(vocab=20, d=8, n_heads=2, max_len=16, mask_offset=2).eval()
    tight = LastPosition(vocab=20, d=8, n_heads=2, max_len=16, mask_offset=1).eval()
    with pytest.warns(Note, match="last position only"):
        leak = check_model(leaky, checks=["causal"], causal=True).to_json()
        fine = check_model(tight, checks=["causal"], causal=True).to_json()
    assert [f["check"] for f in leak["findings"]] == ["causal"] and leak["findings"][0]["severity"] == "error"
    assert fine["passed"] == ["causal"] and fine["findings"] == []


def test_the_readme_mapping_form_captures_nanogpt_exactly():
    """capture(model, {"input_ids": x}) on nanoGPT's forward(idx, targets=None): the finder's traced
    forward and the capture both call it through diagnose.calling; the maps are its own softmax."""
    import diagnose

    from .clients import nanogpt

    model = nanogpt.make(flash=False)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    cap = diagnose.capture(model, {"input_ids": ids}, activations=False)
    attn = model.transformer.h[0].attn
    with torch.no_grad():
        x = model.transformer.wte(ids) + model.transformer.wpe(torch.arange(8))
        q, k, _ = attn.c_attn(model.transformer.h[0].ln_1(x)).split(32, dim=2)
        q, k = (t.view(2, 8, 2, 16).transpose(1, 2) for t in (q, k))  # [B, nh, T, hs]
        scores = (q @ k.transpose(-2, -1)) / 4.0  # sqrt(hs)
        want = scores.masked_fill(torch.ones(8, 8).triu(1).bool(), float("-inf")).softmax(-1)  # [B, nh, T, T]
    assert len(cap.attention) == 2
    assert_close(cap.attention[0], want, depth=1, width=32)


def test_a_last_position_model_is_cut_once_for_the_sweep_and_its_groups():
    """ablate_heads scores nanoGPT on the token after each example's last input; the group closed
    with --together sees the same cut batches (its baseline is the sweep's, not a second cut)."""
    import diagnose

    from .clients import nanogpt

    model = nanogpt.make()
    ids = torch.randint(0, 64, (16, 12), generator=torch.Generator().manual_seed(0))
    with pytest.warns(Note, match="last position only"):
        result = diagnose.ablate_heads(model, {"input_ids": ids}, task="lm", together=[[(0, 0), (0, 1)]],
                                       progress=None).to_json()
    with torch.no_grad():
        logits, _ = model(ids[:, :-1])  # [16, 1, 64]: after the first 11 tokens
    want = torch.nn.functional.cross_entropy(logits[:, 0], ids[:, -1])
    assert result["n_units"] == 16
    assert result["baseline"]["loss"] == approx(float(want), depth=2, width=32)
    assert result["together"][0]["baseline_loss"] == approx(float(want), depth=2, width=32)
