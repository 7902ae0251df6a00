"""Models dispatched over several devices (device_map style): inputs go to the device of the
model's first parameter (the embedding), every statistic is computed on its layer's device and
comes back as plain floats or CPU tensors, and the results equal the single-device run.

torch has one CPU device, so a real split needs an accelerator: the split test runs on 'cpu' +
'cuda' where CUDA is present and is skipped elsewhere. On a CPU-only machine the same dispatch
(with its per-module device hooks) runs over 'cpu' alone, which checks the plumbing but not a
device mismatch; README (Limits) says so.
"""

from __future__ import annotations

import pytest
import torch

import diagnose
from diagnose.ablation import ablate_heads

from .long_model import LongLM, dispatch
from .tolerance import approx, assert_close, loss_tol, size_of

pytestmark = pytest.mark.numerics

SPLITS = [["cpu", "cpu"]] + ([["cuda", "cpu"], ["cpu", "cuda"]] if torch.cuda.is_available() else [])


def make() -> LongLM:
    torch.manual_seed(0)
    return LongLM(vocab=32, d=16, n_heads=4).eval()


@pytest.mark.parametrize("devices", SPLITS, ids=["+".join(d) for d in SPLITS])
def test_split_model_gives_the_single_device_results(devices):
    ids = torch.randint(0, 32, (4, 12), generator=torch.Generator().manual_seed(1))  # [B, T]
    one, split = make(), dispatch(make(), devices)
    size = size_of(one)
    assert next(split.parameters()).device.type == devices[0]
    first = ids.to(devices[0])  # the embedding's device, as ablate_heads' batches go

    want, got = diagnose.capture(one, ids), diagnose.capture(split, first)
    for a, b, dev in zip(got.attention, want.attention, devices):
        assert a.device.type == dev  # each map where its layer ran, not gathered on one device
        assert_close(a.cpu(), b, **size)
    for name, st in got.activations.items():
        assert st == approx(want.activations[name], **size), name

    s_one = diagnose.attention_summary(one, [ids], keep=1)
    s_split = diagnose.attention_summary(split, [first], keep=1)
    assert all(e.device.type == "cpu" for e in s_split.examples)
    for a, b in zip(s_split.stats, s_one.stats):
        for k in a:
            assert a[k] == approx(b[k], **size), k

    r_one = ablate_heads(one, {"input_ids": ids}, task="lm", progress=False, attention=False)
    r_split = ablate_heads(split, {"input_ids": ids}, task="lm", progress=False, attention=False)
    for a, b in zip(r_split.heads, r_one.heads):
        assert a.delta_loss == pytest.approx(b.delta_loss, abs=loss_tol(r_one.baseline["loss"], **size))
