"""watch_pattern_traced (the hooks the monitor uses under torch.compile) against the model's own
eager attention weights (output_attentions): q and k rebuilt from the projections (and rotated,
normalised, grouped) must give the very map the model computed, padding included."""

from __future__ import annotations

from contextlib import ExitStack

import pytest
import torch

import diagnose
from diagnose.adapters.base import TRACED_HOOKS, compile_safe
from ..tolerance import assert_close

pytestmark = pytest.mark.numerics

transformers = pytest.importorskip("transformers")
D_MODEL, T = 32, 7


def _config(name: str, attn: str):
    t = transformers
    small = dict(num_hidden_layers=2, hidden_size=D_MODEL, intermediate_size=64, vocab_size=40, bos_token_id=0,
                 eos_token_id=0, pad_token_id=0, attn_implementation=attn)
    if name == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(n_layer=2, n_head=4, n_embd=D_MODEL, vocab_size=40, bos_token_id=0,
                                              eos_token_id=0, attn_implementation=attn))
    if name == "bert":
        return t.BertModel(t.BertConfig(num_hidden_layers=2, hidden_size=D_MODEL, num_attention_heads=4,
                                        intermediate_size=64, vocab_size=40, attn_implementation=attn))
    gqa = dict(num_attention_heads=4, num_key_value_heads=2)
    if name == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(**small, **gqa))
    if name == "qwen3":  # q_norm / k_norm on each head before the rotation
        return t.Qwen3ForCausalLM(t.Qwen3Config(**small, **gqa, head_dim=8))
    if name == "olmo2":  # q_norm / k_norm on the whole projection
        return t.Olmo2ForCausalLM(t.Olmo2Config(**small, **gqa))
    if name == "mistral":  # a sliding window shorter than the sequence: the mask carries it
        return t.MistralForCausalLM(t.MistralConfig(**small, **gqa, sliding_window=3))
    raise ValueError(name)


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama", "qwen3", "olmo2", "mistral"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_traced_watch_gives_the_models_own_attention(name, attn):
    torch.manual_seed(0)
    model = _config(name, attn).eval()
    ids = torch.randint(1, 40, (2, T))  # [B, T]
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, :2] = 0  # left padding in the second example
    sites = diagnose.find_heads(model)
    assert all(compile_safe(s) == TRACED_HOOKS for s in sites)  # the hooks below work eagerly on any torch
    got: list[list] = [[] for _ in sites]
    with ExitStack() as stack:  # grad enabled: the hooks read training forwards only
        for s, out in zip(sites, got):
            stack.enter_context(s.adapter.watch_pattern_traced(s, lambda p, out=out: out.append(p)))
        model(input_ids=ids, attention_mask=mask)
    ref = _config(name, "eager").eval()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask, output_attentions=True).attentions  # per layer [B, H, T, T]
    for s, probs, w in zip(sites, got, want, strict=True):
        assert len(probs) == 1, s.name
        p = probs[0] if isinstance(probs[0], torch.Tensor) else probs[0].full()
        assert isinstance(probs[0], torch.Tensor) == (attn == "eager")
        rows = mask.bool()[:, None, :, None].expand_as(w)  # a padded query row is the model's own choice
        assert_close(p[rows], w[rows].float(), scale=1.0, depth=2, width=D_MODEL)
