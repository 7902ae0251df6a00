"""Half-precision models (bf16 or fp16 weights, or float32 weights under torch.autocast to bf16 on the CPU):
maps and statistics come back float32, the loss is computed in float32, and ablation deltas
agree with the same half-precision model whose head's output-projection weights are zeroed."""

from __future__ import annotations

import contextlib

import pytest
import torch

import diagnose
from diagnose.ablation import ablate_heads
from diagnose.zoo import ModelConfig, Transformer

from .ablation.helpers import evaluate, with_head_weights_zeroed
from .long_model import LongLM
from .tolerance import approx, assert_close, loss_tol, magnitude, size_of

pytestmark = pytest.mark.numerics

V, T, N, H, D = 20, 7, 8, 4, 8


def reference_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(kind="lm", vocab_size=V, max_len=16, n_layers=2, n_heads=H, d_model=H * D,
                                   init_std=0.2)).eval()


def sdpa_model() -> LongLM:
    torch.manual_seed(0)
    return LongLM(vocab=V, d=H * D, n_heads=H).eval()


def ids() -> torch.Tensor:
    return torch.randint(1, V, (N, T), generator=torch.Generator().manual_seed(3))  # [N, T]


MODES = {  # how the model runs in half precision: (model transform, context)
    "bf16-weights": (lambda m: m.to(torch.bfloat16), contextlib.nullcontext),
    "fp16-weights": (lambda m: m.to(torch.float16), contextlib.nullcontext),
    "autocast-bf16": (lambda m: m, lambda: torch.autocast("cpu", dtype=torch.bfloat16)),
}


@pytest.mark.parametrize("make", [reference_model, sdpa_model], ids=["own-softmax", "sdpa"])
@pytest.mark.parametrize("mode", list(MODES))
def test_capture_and_summary_in_float32(make, mode):
    cast, ctx = MODES[mode]
    x = ids()
    want = diagnose.capture(make(), x)  # float32 model: the reference
    half = cast(make())
    with ctx():
        got = diagnose.capture(half, x)
        summary = diagnose.attention_summary(half, [x], keep=1)
    assert got.output.dtype in (torch.bfloat16, torch.float16), "the model really ran in half precision"
    half_dtype, size = got.output.dtype, size_of(make())
    for a, b in zip(got.attention, want.attention):
        assert a.dtype == torch.float32 and a.shape == b.shape
        assert_close(a.sum(-1), torch.ones(a.shape[:3]), dtype=half_dtype)  # rows sum to 1, half rounding
        assert_close(a, b, **size, dtype=half_dtype)  # the float32 model's maps, up to half rounding
    for name, st in got.activations.items():
        assert all(isinstance(v, float) for v in st.values()), name
        assert st["var"] == approx(want.activations[name]["var"], **size, dtype=half_dtype)
    ref = diagnose.attention_summary(make(), [x], keep=1)
    for a, b in zip(summary.stats, ref.stats):
        for k in ("entropy", "max_weight", "prev_token", "mean_distance"):
            assert a[k] == approx(b[k], scale=max(1.0, magnitude(b[k])), **size, dtype=half_dtype), k
    assert summary.examples[0].dtype == torch.float32


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_ablation_in_half_precision_matches_zeroed_weights(mode):
    cast, ctx = MODES[mode]
    model = cast(reference_model())
    data = {"input_ids": ids()}
    with ctx():
        result = ablate_heads(model, data, task="lm", batch_size=N, progress=False, attention=True)
        acc, base = evaluate(model, [(data, None)], "lm")  # float32 loss of the bf16 logits
    size = size_of(reference_model())
    assert result.baseline["loss"] == approx(base, width=N * T)  # the same half logits: float32 sums
    # half logits: batch composition changes their rounding (measured: about 1e-2 of the loss)
    tol = loss_tol(base, **size, dtype=torch.bfloat16)
    for h in result.heads:
        proj = model.blocks[h.layer].attn.proj
        with ctx():
            _, zeroed = with_head_weights_zeroed(proj.weight, 1, h.head, D,
                                                 lambda: evaluate(model, [(data, None)], "lm"))
        assert h.delta_loss == pytest.approx(zeroed - base, abs=tol), (h.layer, h.head)
        assert h.attention is not None and all(v == v for v in h.attention.values())  # statistics, no NaN
