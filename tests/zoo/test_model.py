"""The reference model's switches do what the lessons say."""

from __future__ import annotations

import math

import pytest
import torch

from diagnose.errors import ConfigError
from diagnose.zoo import ModelConfig, Transformer
from ..tolerance import assert_close, assert_differ, changed, size_of

pytestmark = pytest.mark.numerics


def _scores_std(cfg: ModelConfig, x: torch.Tensor) -> float:
    """Std of pre-softmax scores of layer 0, computed from the model's own q and k."""
    model = Transformer(cfg).eval()
    attn = model.blocks[0].attn
    h = model.blocks[0].ln1(model.tok_emb(x) + model.pos_emb(torch.arange(x.shape[1])))
    q, k, _ = attn.qkv(h).split(cfg.d_model, dim=2)
    B, T, _ = q.shape
    q = q.view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2)
    k = k.view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2)
    s = q @ k.transpose(-2, -1)
    if cfg.attn_scale == "sqrt":
        s = s / math.sqrt(cfg.head_dim)
    return float(s.detach().std())


def test_unscaled_logits_grow_like_sqrt_dk():
    # q and k entries of unit variance (init std 1/sqrt(d_model)): q.k then has std ~ sqrt(d_k)
    # without scaling, and ~1 whatever d_k with 1/sqrt(d_k).
    x = torch.randint(0, 32, (8, 32))
    std = {}
    for scale in ("none", "sqrt"):
        for d_k in (16, 64):
            torch.manual_seed(d_k)
            cfg = ModelConfig(vocab_size=32, max_len=32, n_heads=2, d_model=2 * d_k, attn_scale=scale,
                              init_std=1 / math.sqrt(2 * d_k))
            std[scale, d_k] = _scores_std(cfg, x)
    assert std["none", 64] / std["none", 16] == pytest.approx(2.0, rel=0.15)
    assert std["sqrt", 64] / std["sqrt", 16] == pytest.approx(1.0, rel=0.15)
    assert std["sqrt", 16] == pytest.approx(1.0, rel=0.25)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_encoder_without_positions_is_permutation_equivariant(norm):
    cfg = ModelConfig(kind="lm", causal=False, positions="none", norm=norm, vocab_size=20, max_len=12)
    model = Transformer(cfg).eval()
    x = torch.randint(0, 20, (3, 12))
    perm = torch.randperm(12)
    with torch.no_grad():
        assert_close(model(x)[:, perm], model(x[:, perm]), **size_of(model))


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary"])
def test_positions_break_permutation_equivariance(positions):
    cfg = ModelConfig(kind="lm", causal=False, positions=positions, vocab_size=20, max_len=12, init_std=0.2)
    model = Transformer(cfg).eval()
    x = torch.randint(0, 20, (3, 12))
    perm = torch.randperm(12)
    with torch.no_grad():
        assert_differ(model(x)[:, perm], model(x[:, perm]), **size_of(model))


def test_causal_lm_does_not_see_the_future():
    model = Transformer(ModelConfig(kind="lm", vocab_size=20, max_len=10)).eval()
    x = torch.randint(0, 20, (2, 10))
    y = x.clone()
    y[:, 6:] = (y[:, 6:] + 1) % 20
    with torch.no_grad():
        a, b = model(x), model(y)
    assert_close(a[:, :6], b[:, :6], **size_of(model))
    assert_differ(a[:, 6:], b[:, 6:], **size_of(model))


@pytest.mark.parametrize("fill,leaks", [("large", False), ("-inf", False), ("zero", True)])
def test_mask_fill_zero_leaks_padding(fill, leaks):
    cfg = ModelConfig(kind="classifier", vocab_size=20, max_len=10, mask_fill=fill, init_std=0.2)
    model = Transformer(cfg).eval()
    x = torch.randint(1, 20, (4, 10))
    mask = torch.ones_like(x)
    mask[:, 6:] = 0
    y = x.clone()
    y[:, 6:] = (y[:, 6:] + 3) % 20  # change only the padding's content
    with torch.no_grad():
        assert changed(model(x, mask), model(y, mask), **size_of(model)) == leaks


def test_residual_off_and_post_ln_build_and_run():
    for kw in (dict(residual=False), dict(norm="post"), dict(norm="post", residual=False)):
        model = Transformer(ModelConfig(n_layers=3, **kw)).eval()
        out = model(torch.randint(0, 32, (2, 8)))
        assert out.shape == (2, 8, 32) and torch.isfinite(out).all()


def test_init_std_and_residual_scaling():
    cfg = ModelConfig(n_layers=8, d_model=128, n_heads=4)
    model = Transformer(cfg)
    assert float(model.blocks[0].mlp.fc.weight.std()) == pytest.approx(0.02, rel=0.05)
    assert float(model.blocks[0].attn.proj.weight.std()) == pytest.approx(0.02 / 4, rel=0.08)


def test_bad_config_is_a_clear_error():
    with pytest.raises(ConfigError, match="divisible"):
        ModelConfig(d_model=30, n_heads=4)
    with pytest.raises(ConfigError, match="mask_fill"):
        ModelConfig(mask_fill="nope")


@pytest.mark.parametrize("changes,words", [
    ({"n_heads": 0}, "n_heads must be at least 1"), ({"d_model": -16}, "d_model must be at least 1"),
    ({"n_layers": float("inf")}, "n_layers must be an integer"), ({"n_layers": True}, "n_layers must be an integer"),
    ({"dropout": float("nan")}, "dropout must be a finite number"), ({"positions": ["x"]}, "positions="),
    ({"causal": "yes"}, "causal must be"),
])
def test_config_refuses_bad_values_before_any_arithmetic(changes, words):
    """n_heads = 0 used to reach `d_model % n_heads` first (ZeroDivisionError)."""
    with pytest.raises(ConfigError, match=words):
        ModelConfig(**changes)
