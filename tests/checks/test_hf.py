"""Hugging Face models built from configs: correct ones raise no finding, eager and SDPA alike."""

from __future__ import annotations

import pytest

from diagnose import check_model
from diagnose.checks._causal import declared_causal

pytestmark = pytest.mark.numerics

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=100)


def _gpt2(impl):
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=32, attn_implementation=impl,
                                  bos_token_id=1, eos_token_id=2, **SMALL)
    return transformers.GPT2LMHeadModel(cfg)


def _bert(impl, head):
    cfg = transformers.BertConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=64, intermediate_size=128,
                                  max_position_embeddings=32, attn_implementation=impl, **SMALL)
    return getattr(transformers, head)(cfg)


def _llama(impl):
    cfg = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
                                   intermediate_size=128, max_position_embeddings=32, attn_implementation=impl,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=0, **SMALL)
    return transformers.LlamaForCausalLM(cfg)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_decoders_pass_every_check(impl):
    for model in (_gpt2(impl), _llama(impl)):
        assert declared_causal(model) is True
        result = check_model(model)
        assert list(result) == [], [f.title for f in result]
        assert result.passed == ["causal", "padding", "scaling", "positions"]


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_bert_passes_and_is_not_called_a_causal_leak(impl):
    result = check_model(_bert(impl, "BertForSequenceClassification"))
    assert list(result) == [] and "causal" in result.skipped[0]["check"]  # pooled output
    mlm = check_model(_bert(impl, "BertForMaskedLM"))
    assert [(f.check, f.severity) for f in mlm] == [("causal", "info")]  # bidirectional, as an encoder should be
    assert mlm.problems == []


def test_transformer_lens_bridge_passes(tmp_path):
    bridge = pytest.importorskip("transformer_lens.model_bridge")
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=32, bos_token_id=1, eos_token_id=2,
                                  **SMALL)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2")
    model = bridge.TransformerBridge.boot_transformers(str(tmp_path / "gpt2"), device="cpu")
    result = check_model(model)  # forward(input, attention_mask=...): ids go in as `input`
    assert list(result) == [] and result.passed == ["causal", "padding", "scaling", "positions"]


def test_roberta_numbering_positions_from_the_pad_id_is_not_a_padding_leak():
    cfg = transformers.RobertaConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=64, intermediate_size=128,
                                     max_position_embeddings=40, pad_token_id=1, **SMALL)
    result = check_model(transformers.RobertaForMaskedLM(cfg), checks=["padding"])
    (f,) = result
    assert f.severity == "info" and "pad id" in f.title and result.passed == ["padding"]
    assert f.evidence["max_relative_change_content_left"] > 1e-3  # measured, and explained
    assert f.evidence["max_relative_change_length"] <= 1e-4
