"""The tests' one way to say "equal": diagnose/_tolerance.py's policy (docs/development.md,
"Tolerances"). No test writes a tolerance of its own; it states what was computed (its scale, the
layers and the longest sum it crossed, its dtype) and the policy turns that into a tolerance.

    assert_close(got, want, depth=2, width=32)   # float tensors computed two ways
    assert x == approx(want, width=N)            # numbers, lists, dicts (pytest.approx)
    assert_exact(got, want)                       # same operations, same order: bit-equal
    assert_differ(a, b)                           # must change: far beyond the tolerance
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from diagnose._tolerance import EXACT, MARGIN, SAFETY, eps, magnitude, model_size, output_scale, tolerance

__all__ = ["assert_close", "assert_exact", "assert_differ", "changed", "approx", "loss_tol", "tol", "differ", "size_of",
           "output_scale", "magnitude", "tolerance", "EXACT", "SAFETY", "eps"]

F64 = torch.float64
F16 = torch.float16


def size_of(model: torch.nn.Module) -> dict[str, int]:
    """The policy's depth (attention layers) and width (d_model) of a model, from find_heads."""
    from diagnose.sites import find_heads
    depth, width = model_size(find_heads(model))
    return {"depth": depth, "width": width}


def tol(scale: float, *, depth: int = 1, width: int = 1, dtype: torch.dtype = torch.float32) -> float:
    """The policy's absolute tolerance (diagnose._tolerance.tolerance)."""
    return tolerance(scale, depth=depth, width=width, dtype=dtype)


def assert_close(a: Any, b: Any, *, scale: float | None = None, depth: int = 1, width: int = 1,
                 dtype: torch.dtype | None = None) -> None:
    """a equals b (float tensors) within the policy; scale defaults to output_scale(b) (>= 1).
    dtype defaults to b's (float32 for integer tensors)."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    dtype = dtype or (b.dtype if b.is_floating_point() else torch.float32)
    t = tol(output_scale(b) if scale is None else scale, depth=depth, width=width, dtype=dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    diff = float((a.double() - b.double().to(a.device)).abs().max()) if b.numel() else 0.0
    assert diff <= t, f"max |diff| {diff:.3g} > tolerance {t:.3g} (scale {scale}, depth {depth}, width {width})"


def assert_exact(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bit-equal: the same operations in the same order (a reload, a cache) round the same way."""
    torch.testing.assert_close(a, b, **EXACT)


def differ(a: Any, b: Any, *, scale: float | None = None, depth: int = 1, width: int = 1,
           dtype: torch.dtype = torch.float32) -> bool:
    """a and b differ by MARGIN tolerances or more somewhere: a real change, not rounding."""
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    t = tol(output_scale(b) if scale is None else scale, depth=depth, width=width, dtype=dtype)
    return a.shape != b.shape or float((a - b).abs().max()) > MARGIN * t


def changed(a: Any, b: Any, **size: Any) -> bool:
    """False when a equals b within the policy, True when they differ (`differ`); a difference in
    between is neither rounding nor a clear change, and fails the test rather than pick a side."""
    a_t, b_t = torch.as_tensor(a), torch.as_tensor(b)
    if differ(a_t, b_t, **size):
        return True
    assert_close(a_t, b_t, **size)
    return False


def assert_differ(a: Any, b: Any, **size: Any) -> None:
    """a and b must differ (see `differ`): weaker differences would pass as rounding."""
    assert differ(a, b, **size), "the values differ by no more than rounding could explain"


def approx(expected: Any, *, scale: float | None = None, depth: int = 1, width: int = 1,
           dtype: torch.dtype = torch.float32):
    """pytest.approx with the policy's tolerance: scale defaults to the largest |expected| (the
    magnitude summed: pass `scale` when the result cancels, e.g. a mean near 0 of values near 1).
    A NaN expected matches only a NaN (both say "not measurable": a token statistic without ids)."""
    s = magnitude(expected) if scale is None else scale
    return pytest.approx(expected, rel=0, abs=tol(s, depth=depth, width=width, dtype=dtype), nan_ok=True)


def loss_tol(*losses: float, depth: int = 1, width: int = 1, dtype: torch.dtype = torch.float32) -> float:
    """Absolute tolerance for a difference of float32 losses: rounding scales with the losses
    subtracted (a delta of 0.009 between two losses of 5 carries their relative rounding)."""
    return tol(max([1.0, *(abs(float(x)) for x in losses)]), depth=depth, width=width, dtype=dtype)
