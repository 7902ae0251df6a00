"""TransformerLens 4 TransformerBridge over GPT-2 and over LLaMA (GQA, rotary): captured maps
equal its own hook_pattern cache; the gate on the `o` bridge matches zeroing the head's weights;
no hook is left."""

from __future__ import annotations

import pytest
import torch

import diagnose

from ..hooks import hook_snapshot
from ..tolerance import approx, assert_exact
from ..wordlevel import make_tokenizer

pytestmark = pytest.mark.numerics

pytest.importorskip("transformer_lens")
transformers = pytest.importorskip("transformers")


def _gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_head=4, n_embd=32, vocab_size=50, n_positions=32, bos_token_id=0, eos_token_id=0))


def _llama():  # grouped-query attention (2 key/value heads for 4 query heads) and rotary positions
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=50, max_position_embeddings=32, bos_token_id=0, eos_token_id=0))


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def bridge(request, tmp_path_factory):
    from transformer_lens.model_bridge import TransformerBridge

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tl") / request.param
    {"gpt2": _gpt2, "llama": _llama}[request.param]().save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)  # the bridge loads one; nothing may come from the hub
    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu").eval()
    with torch.no_grad():  # the bridge adds hooks of its own at its first forward: before any test's snapshot
        bridge(torch.randint(0, 50, (1, 3)))
    return bridge


def test_sites_and_maps_equal_hook_pattern(bridge):
    ids = torch.randint(0, 50, (2, 7))  # [B, T]
    sites = diagnose.find_heads(bridge)
    assert [(s.name, s.n_heads, s.head_dim, s.adapter.family) for s in sites] == [
        (f"blocks.{i}.attn", 4, 8, "transformer-lens") for i in range(2)]
    with torch.no_grad():
        plain, cache = bridge.run_with_cache(ids)
    before = hook_snapshot(bridge)
    cap = diagnose.capture(bridge, ids)
    assert hook_snapshot(bridge) == before
    for i, got in enumerate(cap.attention):
        want = cache[f"blocks.{i}.attn.hook_pattern"]  # [B, H, T, T]
        assert_exact(got, want)  # the same forward's softmax, read at another hook
    assert_exact(cap.output, plain)  # watching changes nothing
    assert list(cap.activations) == ["blocks.0", "blocks.1"]


def test_gate(bridge, gate_check):
    gate_check(bridge, torch.randint(0, 50, (2, 7)))


def test_the_monitor_records_the_max_logit_of_hook_attn_scores(bridge, tmp_path):
    """The largest visible logit per head, as the bridge's own hook_attn_scores holds it (masked entries,
    the dtype's minimum, do not win), and softmax of those scores is the pattern the entropy is read from."""
    from diagnose.monitor import TrainingMonitor

    ids = torch.randint(0, 50, (2, 7))  # [B, T]
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids)
    with TrainingMonitor(bridge, tmp_path / "r", attention_every=1, every=1, echo=False) as mon:
        bridge(ids).sum().backward()
        record = mon.step(1.0)
    bridge.zero_grad(set_to_none=True)
    for i in range(2):
        scores = cache[f"blocks.{i}.attn.hook_attn_scores"]  # [B, H, T, T]
        assert_exact(torch.softmax(scores, -1), cache[f"blocks.{i}.attn.hook_pattern"])
        want = scores.amax(dim=(0, 2, 3))  # [H]
        assert record["attention"][f"blocks.{i}.attn"]["max_logit"] == approx(want.tolist())
