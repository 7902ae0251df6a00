"""Hugging Face GPT-2 (also with cross-attention), BERT (padding) and LLaMA-style (GQA + RoPE),
each under eager and sdpa: captured maps equal the eager model's own output_attentions, outputs
are untouched, the gate matches weight zeroing, and no hook is left."""

from __future__ import annotations

import pytest
import torch

import diagnose
from diagnose.adapters._intercept import AttentionMode

from ..hooks import hook_snapshot
from ..tolerance import assert_close, assert_exact, size_of

pytestmark = pytest.mark.numerics

transformers = pytest.importorskip("transformers")

FAMILIES = {
    "gpt2": (lambda: transformers.GPT2LMHeadModel,
             lambda: transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=50, n_positions=32,
                                             bos_token_id=0, eos_token_id=0), "hf-gpt2"),
    "bert": (lambda: transformers.BertModel,
             lambda: transformers.BertConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=32,
                                             intermediate_size=64, vocab_size=50, max_position_embeddings=32),
             "hf-bert"),
    "llama": (lambda: transformers.LlamaForCausalLM,
              lambda: transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               hidden_size=32, intermediate_size=64, vocab_size=50,
                                               max_position_embeddings=32, bos_token_id=0, eos_token_id=0,
                                               pad_token_id=0), "hf-llama"),
}


def build(family: str, impl: str):
    cls, cfg, _ = FAMILIES[family]
    torch.manual_seed(0)
    config = cfg()
    config._attn_implementation = impl
    return cls()(config).eval()


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 50, (3, 9), generator=g)  # [B, T]
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0  # right padding
    mask[2, 4:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_maps_equal_eager_output_attentions(family, impl, batch, model_output):
    model = build(family, impl)
    eager = build(family, "eager")
    eager.load_state_dict(model.state_dict())
    with torch.no_grad():
        ref = eager(**batch, output_attentions=True).attentions  # per layer [B, H, T, T]
        plain = model_output(model, batch)
    kinds: list[str] = []
    with AttentionMode(lambda kind, _p, _q: kinds.append(kind)), torch.no_grad():
        model(**batch)
    assert set(kinds) == {"softmax" if impl == "eager" else "sdpa"}, "the model did not take the path under test"

    sites = diagnose.find_heads(model)
    assert [s.adapter.family for s in sites] == [FAMILIES[family][2]] * 2
    assert (sites[0].n_heads, sites[0].head_dim) == (4, 8)
    before = hook_snapshot(model)
    cap = diagnose.capture(model, batch)
    assert hook_snapshot(model) == before
    size = size_of(model)
    for got, want in zip(cap.attention, ref):
        assert got.dtype == torch.float32 and got.shape == (3, 4, 9, 9)
        assert_close(got, want, scale=1.0, **size)  # vs the eager twin's maps (sdpa: recomputed, other sums)
    assert_exact(model_output(model, batch), plain)  # capture left the model as it was
    out = cap.output.logits if hasattr(cap.output, "logits") else cap.output.last_hidden_state
    assert_exact(out, plain)  # watching changes nothing
    assert len(cap.activations) == 2 and set(next(iter(cap.activations.values()))) >= {"mean", "var", "max_abs"}


def test_llama_gqa_recorded(batch):
    site = diagnose.find_heads(build("llama", "sdpa"))[0]
    assert site.n_kv_heads == 2 and site.n_heads == 4


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_gate(family, impl, batch, gate_check):
    gate_check(build(family, impl), batch, valid=batch["attention_mask"])


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_gpt2_cross_attention(impl, gate_check):
    """A GPT-2 decoder with cross-attention (add_cross_attention=True): each block's self- and
    cross-attention are two sites, in forward order, and both equal the eager model's maps."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=50, n_positions=32,
                                  bos_token_id=0, eos_token_id=0, add_cross_attention=True)
    cfg._attn_implementation = impl
    model = transformers.GPT2LMHeadModel(cfg).eval()
    inputs = {"input_ids": torch.randint(1, 50, (2, 7)), "encoder_hidden_states": torch.randn(2, 5, 32)}
    sites = diagnose.find_heads(model)
    assert [s.name for s in sites] == ["transformer.h.0.attn", "transformer.h.0.crossattention",
                                       "transformer.h.1.attn", "transformer.h.1.crossattention"]
    eager_cfg = transformers.GPT2Config.from_dict(cfg.to_dict())
    eager_cfg._attn_implementation = "eager"
    eager = transformers.GPT2LMHeadModel(eager_cfg).eval()
    eager.load_state_dict(model.state_dict())
    with torch.no_grad():
        want = eager(**inputs, output_attentions=True)
    before = hook_snapshot(model)
    cap = diagnose.capture(model, inputs)
    assert hook_snapshot(model) == before
    expected = [m for pair in zip(want.attentions, want.cross_attentions) for m in pair]
    size = size_of(model)
    for got, ref in zip(cap.attention, expected, strict=True):
        assert_close(got, ref, scale=1.0, **size)  # [B, H, 7, 7] and [B, H, 7, 5]
    assert_close(cap.output.logits, want.logits, **size)  # vs the eager twin (sdpa: other sums)
    gate_check(model, inputs)
