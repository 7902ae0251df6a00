"""hidden_stats against direct computations on hand-made tensors."""

import pytest
import torch

from diagnose._activations import hidden_stats
from .tolerance import assert_close, assert_exact, magnitude

pytestmark = pytest.mark.numerics


def test_matches_direct_computation_with_padding():
    x = torch.randn(3, 5, 8)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    got = hidden_stats(x, mask)
    real = x[mask.bool()]  # [n_real, C]
    n = real.numel()
    assert_close(got[0], real.mean(), scale=magnitude(real), width=n)
    assert_close(got[1], real.var(unbiased=False), scale=magnitude(real) ** 2, width=n)
    assert_exact(got[2], real.abs().max())
    cos = []
    for b in range(3):
        xb = torch.nn.functional.normalize(x[b][mask[b].bool()], dim=-1)
        sim = xb @ xb.T
        k = sim.shape[0]
        cos.append((sim.sum() - sim.diagonal().sum()) / (k * (k - 1)))
    assert_close(got[3], torch.stack(cos).mean(), scale=1.0, width=n)


def test_collapsed_tokens_have_cosine_one():
    v = torch.randn(1, 1, 16)
    assert_close(hidden_stats(v.expand(2, 7, 16) * 3)[3], torch.tensor(1.0), scale=1.0, width=2 * 7 * 16)


def test_mask_free_path_equals_all_ones_mask():
    x = torch.randn(4, 6, 8) * 3 + 1
    assert_close(hidden_stats(x), hidden_stats(x, torch.ones(4, 6)), scale=magnitude(x) ** 2, width=x.numel())


def test_one_pass_variance_holds_with_a_large_mean():
    x = torch.randn(8, 16, 64) * 0.5 + 50.0
    mask = torch.ones(8, 16)
    mask[:, 12:] = 0
    got = hidden_stats(x, mask)
    real = x[mask.bool()]
    # shifted one-pass sums: rounding relative to the spread, not to mean^2 = 2500 (the naive formula's)
    assert_close(got[1], real.var(unbiased=False), scale=magnitude(real - real.mean()) ** 2, width=real.numel())


def test_an_all_zero_row_adds_zero_to_every_cosine():
    x = torch.randn(1, 4, 8)
    x[0, 2] = 0.0  # e.g. a position a ReLU stack zeroed out: no direction
    u = torch.nn.functional.normalize(x[0], dim=-1)
    sim = u @ u.T
    expected = (sim.sum() - sim.diagonal().sum()) / (4 * 3)
    assert_close(hidden_stats(x)[3], expected, scale=1.0, width=x.numel())


def test_large_tensor_with_padding_matches_direct_computation():
    torch.manual_seed(1)
    x = torch.randn(4, 64, 96) * 2 + 0.3
    mask = torch.ones(4, 64)
    mask[1, 40:] = 0
    mask[3, 1:] = 0  # one real position: no pairs, left out of token_cos
    got = hidden_stats(x, mask)
    real = x[mask.bool()].double()
    n = real.numel()
    assert_close(got[:3].double(), torch.stack([real.mean(), real.var(unbiased=False), real.abs().max()]),
                 scale=magnitude(real) ** 2, width=n, dtype=torch.float32)  # float32 sums against float64
    cos = []
    for b in range(3):
        xb = torch.nn.functional.normalize(x[b][mask[b].bool()].double(), dim=-1)
        sim = xb @ xb.T
        k = sim.shape[0]
        cos.append((sim.sum() - sim.diagonal().sum()) / (k * (k - 1)))
    assert_close(got[3].double(), torch.stack(cos).mean(), scale=1.0, width=n, dtype=torch.float32)
