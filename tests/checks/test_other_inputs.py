"""Models whose input is not token ids, and encoder-decoders: probed with their own inputs, the
encoder and the decoder checked separately, every check that cannot apply skipped with why, and
no false error on correct models (BART, given input_ids only, used to get causal and padding errors)."""

from __future__ import annotations

import pytest
import torch

from diagnose import check_model

pytestmark = pytest.mark.numerics

transformers = pytest.importorskip("transformers")


def _vit(impl):
    cfg = transformers.ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=64, attn_implementation=impl)
    return transformers.ViTForImageClassification(cfg)


def _clip(impl):
    cfg = transformers.CLIPVisionConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=64, attn_implementation=impl)
    return transformers.CLIPVisionModel(cfg)


def _bart(impl):
    cfg = transformers.BartConfig(vocab_size=60, d_model=32, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, max_position_embeddings=32, pad_token_id=1, bos_token_id=0,
                                  eos_token_id=2, decoder_start_token_id=2, attn_implementation=impl)
    return transformers.BartForConditionalGeneration(cfg)


def _whisper(impl):
    cfg = transformers.WhisperConfig(vocab_size=60, num_mel_bins=8, encoder_layers=1, decoder_layers=1, d_model=32,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_source_positions=8, max_target_positions=16,
                                     pad_token_id=0, decoder_start_token_id=1, bos_token_id=1, eos_token_id=2,
                                     attn_implementation=impl)
    return transformers.WhisperForConditionalGeneration(cfg)


def _skipped(result):
    return {s["check"]: s["why"] for s in result.skipped}


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("build", [_vit, _clip])
def test_image_models_are_probed_with_pixels(build, impl):
    torch.manual_seed(0)
    result = check_model(build(impl))
    assert list(result) == [] and result.passed == ["scaling", "positions"]
    why = _skipped(result)
    assert "no token order" in why["causal"] and "no padding mask" in why["padding"]
    assert result.model["input"] == "pixel_values"


def test_image_model_without_positions_is_found_by_permuting_patches():
    torch.manual_seed(0)
    model = _vit("eager")
    with torch.no_grad():
        model.vit.embeddings.position_embeddings.zero_()  # no position information left
    (f,) = check_model(model, checks=["positions"])
    assert f.severity == "warning" and "patches are permuted" in f.title


def test_image_data_is_used_and_wrong_data_is_one_clear_error():
    from diagnose.errors import DataError

    pixels = torch.randn(3, 3, 16, 16)
    result = check_model(_vit("eager"), {"pixel_values": pixels}, checks=["scaling"])
    assert result.passed == ["scaling"] and result.model["probe"]["data"] == "given"
    with pytest.raises(DataError, match="pixel_values"):
        check_model(_vit("eager"), {"input_ids": torch.ones(2, 4, dtype=torch.long)})


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_bart_parts_are_checked_separately_without_false_errors(impl):
    torch.manual_seed(0)
    result = check_model(_bart(impl))
    assert list(result) == [], [f.title for f in result]
    assert result.passed == ["encoder.padding", "encoder.positions", "decoder.causal", "decoder.padding",
                             "decoder.scaling", "decoder.positions"]
    why = _skipped(result)
    assert "bidirectional" in why["encoder.causal"] and "every attention layer" in why["encoder.scaling"]


@pytest.mark.slow
def test_bart_decoder_leak_is_found_in_the_decoder():
    """A decoder that reads the future (its causal mask dropped) is an error named `decoder:`."""
    torch.manual_seed(0)
    model = _bart("eager")
    for layer in model.model.decoder.layers:
        layer.self_attn.is_causal = False
    import transformers.models.bart.modeling_bart as mb

    original = mb.create_causal_mask
    mb.create_causal_mask = lambda *a, **k: None  # the decoder sees every decoder position
    try:
        result = check_model(model, checks=["causal"])
    finally:
        mb.create_causal_mask = original
    (f,) = result
    assert f.severity == "error" and f.title.startswith("decoder: ") and f.evidence["part"] == "decoder"


@pytest.mark.slow
def test_whisper_is_probed_with_audio_features():
    torch.manual_seed(0)
    result = check_model(_whisper("sdpa"))
    assert list(result) == [] and result.model["input"] == "input_features"
    assert {"decoder.causal", "decoder.scaling"} <= set(result.passed)
    why = _skipped(result)
    assert "convolutions" in why["encoder.positions"] and "no padding mask" in why["encoder.padding"]


@pytest.mark.slow
def test_cli_checks_an_image_model_and_bart_folder(tmp_path):
    from click.testing import CliRunner

    from diagnose.cli.main import cli

    _vit("eager").save_pretrained(tmp_path / "vit")
    _bart("eager").save_pretrained(tmp_path / "bart")
    res = CliRunner().invoke(cli, ["check", str(tmp_path / "vit"), "--strict"])
    assert res.exit_code == 0, res.output
    assert "inputs (random)" in res.output and "[3, 16, 16]" in res.output
    assert "passed: scaling, positions" in res.output
    res = CliRunner().invoke(cli, ["check", str(tmp_path / "bart"), "--strict"])
    assert res.exit_code == 0, res.output
    assert "encoder probed with" in res.output and "decoder.causal" in res.output
