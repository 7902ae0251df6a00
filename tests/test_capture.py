"""capture: inputs as Tensor or Mapping, activation statistics equal to direct statistics of each
block's output, nothing left behind (hooks, modes, weights), also when the forward raises."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import diagnose
from diagnose.zoo import ModelConfig, Transformer

from .hooks import hook_snapshot
from .tolerance import approx, assert_exact, magnitude

pytestmark = pytest.mark.numerics


@pytest.fixture
def model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(kind="classifier", n_layers=3)).eval()


def _direct_stats(x: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """[mean, var, max |x|, mean cosine between distinct real positions] of x [B, T, C], computed
    directly over the real tokens (independent of diagnose's one-pass reductions)."""
    real = x[mask.bool()]  # [n_real, C]
    cos = []
    for b in range(x.shape[0]):
        u = F.normalize(x[b][mask[b].bool()], dim=-1)
        sim, k = u @ u.T, u.shape[0]
        cos.append((sim.sum() - sim.diagonal().sum()) / (k * (k - 1)))
    return [real.mean().item(), real.var(unbiased=False).item(), real.abs().max().item(), torch.stack(cos).mean().item()]


def test_activations_equal_direct_stats_of_block_outputs(model):
    ids = torch.randint(1, 32, (3, 7))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, 4:] = 0
    outs = {}
    handles = [b.register_forward_hook(lambda _m, _a, o, i=i: outs.__setitem__(f"blocks.{i}", o))
               for i, b in enumerate(model.blocks)]
    with torch.no_grad():
        model(ids, mask)
    for h in handles:
        h.remove()
    cap = diagnose.capture(model, {"input_ids": ids, "attention_mask": mask})
    assert list(cap.activations) == ["blocks.0", "blocks.1", "blocks.2"]
    for name, out in outs.items():
        want = _direct_stats(out, mask)
        got = [cap.activations[name][k] for k in ("mean", "var", "max_abs", "token_cos")]
        assert got == approx(want, scale=magnitude(out) ** 2, width=out.numel())  # float32, two summation orders


def test_tensor_input_and_switches(model):
    ids = torch.randint(0, 32, (2, 5))
    with torch.no_grad():
        plain = model(ids)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    cap = diagnose.capture(model, ids)
    assert_exact(cap.output, plain)  # watching changes nothing
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert [a.shape for a in cap.attention] == [(2, 4, 5, 5)] * 3
    only_maps = diagnose.capture(model, ids, activations=False)
    assert only_maps.activations == {} and torch.equal(only_maps.attention[2], cap.attention[2])
    only_acts = diagnose.capture(model, ids, attention=False)
    assert only_acts.attention == []
    assert only_acts.activations == cap.activations


def test_training_mode_is_kept(model):
    model.train()
    diagnose.capture(model, torch.randint(0, 32, (2, 5)))
    assert all(m.training for m in model.modules())


class Fused(nn.Module):
    """SDPA attention that can be told to fail after the attention call."""

    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(8, 24), nn.Linear(8, 8)
        self.fail = False

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 4).permute(2, 0, 3, 1, 4)  # each [B, H, T, D]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.fail:
            raise RuntimeError("boom inside attention")
        return self.proj(y.transpose(1, 2).reshape(B, T, 8))


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Fused(), Fused()])

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def test_nothing_left_when_forward_raises(model):
    before = hook_snapshot(model)
    with pytest.raises(ValueError, match="exceeds max_len"):
        diagnose.capture(model, torch.randint(0, 32, (1, 100)), sites=diagnose.find_heads(model))
    assert hook_snapshot(model) == before

    stack = Stack().eval()
    sites = diagnose.find_heads(stack, example=torch.randn(2, 5, 8))
    assert [s.adapter.family for s in sites] == ["generic", "generic"]
    before = hook_snapshot(stack)
    stack.layers[1].fail = True
    with pytest.raises(RuntimeError, match="boom"):
        diagnose.capture(stack, torch.randn(2, 5, 8), sites=sites)
    assert hook_snapshot(stack) == before and torch._C._len_torch_function_stack() == 0
    stack.layers[1].fail = False
    cap = diagnose.capture(stack, torch.randn(2, 5, 8))
    assert cap.attention[1].shape == (2, 2, 5, 5) and cap.attention[1].triu(1).abs().max() == 0



def test_no_module_shares_a_public_name():
    """A submodule named like a public function (the module was diagnose/capture.py) is bound over
    the function as soon as anything imports it: `diagnose.capture(...)` then calls a module."""
    import importlib.util

    clashes = [name for name in diagnose.__all__ if importlib.util.find_spec(f"diagnose.{name}") is not None]
    assert clashes == []
