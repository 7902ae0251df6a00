"""One tolerance policy for "these two floats are equal": the library's checks and every test use it.

Derivation. Each float operation rounds with a relative error of at most eps/2 (eps =
`torch.finfo(dtype).eps`: 1.2e-7 for float32, 2.2e-16 for float64, 9.8e-4 for float16). Two
computations of the same quantity that differ only in the order of their sums (another kernel
path, thread count, batch or micro-batch size, a replay instead of a plain forward, a pruned
matmul instead of a gated one) round differently:

* a reduction of `width` terms of magnitude `scale` differs by about eps * scale * sqrt(width)
  (the rounding errors are independent, so they add like a random walk; the worst case,
  eps * scale * width, is far rarer than the bound is loose);
* a network of `depth` layers adds each layer's error to the residual stream, and later layers
  carry it along: the errors add, about linearly in depth;
* half precision (float16, bfloat16) kernels accumulate in float32 and round only each
  operation's result to the half type, so there the width drops out and eps is the half type's.

So the policy is

    tolerance = SAFETY * eps(dtype) * scale * depth * sqrt(width)

with one SAFETY factor for everything, chosen from measurement (bench/tolerance_spread.py; the
figures are in docs/development.md, "Tolerances"): the largest spread measured across the
ATEN_CPU_CAPABILITY kernel paths (default, avx2, avx512) and thread counts was a few units of
eps * scale * depth * sqrt(width), and SAFETY puts the tolerance at least 10x above that,
while a real bug (a wrong head zeroed, a missing 1/sqrt(d) scale) moves outputs by 1e-2 of their
scale or more, thousands of times the tolerance.

`scale` is the magnitude of the values summed, not of the result: a mean near zero of values
near one rounds like the values. For a model's outputs `output_scale` floors it at 1, because a
normalised network's hidden states are of order one whatever the size of its logits.

Comparisons that are not rounding have their own rules:
* exact (`EXACT`): the same operations in the same order (a saved and reloaded model, a cached
  result) must be bit-equal; no tolerance hides a changed operation there;
* "must differ" checks (outputs that must change) need a margin far above the tolerance:
  `clearly_different` asks for at least `MARGIN` times it;
* statistical margins (an init std within 5 %, a Monte-Carlo p-value within 3 standard errors)
  come from the sample size, not from eps; see docs/development.md.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

SAFETY = 16.0  # measured spread <= 1.2 (see docs/development.md "Tolerances"): >= 10x above it
MARGIN = 10.0  # a "must differ" check wants a difference at least MARGIN tolerances wide
EXACT = {"rtol": 0.0, "atol": 0.0}  # same operations, same order: bit-equal


def eps(dtype: torch.dtype = torch.float32) -> float:
    """The dtype's machine epsilon (the gap between 1 and the next representable number)."""
    return float(torch.finfo(dtype).eps)


def tolerance(scale: float, *, depth: int = 1, width: int = 1, dtype: torch.dtype = torch.float32) -> float:
    """The largest difference two orderings of the same float computation may show.

    scale: magnitude of the values summed; depth: layers the error crosses; width: the longest
    reduction (d_model, sequence length, the number of terms of a sum)."""
    assert depth >= 1 and width >= 1, f"depth and width count layers and terms: {depth}, {width}"
    if torch.finfo(dtype).bits <= 16:
        width = 1  # half precision: kernels accumulate in float32 and round only each result
    return SAFETY * eps(dtype) * abs(float(scale)) * depth * math.sqrt(width)


def output_scale(values: torch.Tensor | Iterable[Any] | float) -> float:
    """The scale of a model's outputs: their largest magnitude, at least 1 (hidden states of a
    normalised network are of order one, and their rounding reaches even small logits)."""
    return max(1.0, magnitude(values))


def magnitude(values: torch.Tensor | Iterable[Any] | float) -> float:
    """Largest finite |value| of a tensor, a number, or a (nested) list or dict of them."""
    if isinstance(values, torch.Tensor):
        v = values.detach().float().abs()
        v = v[torch.isfinite(v)]
        return float(v.max()) if v.numel() else 0.0
    if isinstance(values, dict):
        return magnitude(list(values.values()))
    if isinstance(values, (list, tuple)):
        return max((magnitude(v) for v in values), default=0.0)
    try:
        x = abs(float(values))  # numpy arrays and scalars too
    except TypeError:
        import numpy as np
        a = np.abs(np.asarray(values, dtype=float))
        a = a[np.isfinite(a)]
        return float(a.max()) if a.size else 0.0
    return x if math.isfinite(x) else 0.0


def close(a: torch.Tensor, b: torch.Tensor, *, scale: float | None = None, depth: int = 1, width: int = 1,
          dtype: torch.dtype | None = None) -> tuple[bool, float, float]:
    """(equal within the policy, max |a - b|, tolerance); scale defaults to `output_scale(b)`."""
    dtype = dtype or (b.dtype if b.is_floating_point() else torch.float32)
    tol = tolerance(output_scale(b) if scale is None else scale, depth=depth, width=width, dtype=dtype)
    if a.shape != b.shape:
        return False, math.inf, tol
    diff = float((a.double() - b.double()).abs().max()) if b.numel() else 0.0
    return diff <= tol, diff, tol


def model_size(sites: Iterable[Any]) -> tuple[int, int]:
    """(depth, width) of a model for the policy, from its attention sites (`find_heads`): the
    number of attention layers and the residual width d_model = heads x head_dim. The MLP's longer
    reduction (usually 4 d_model) only doubles sqrt(width); SAFETY was measured with it in."""
    sites = list(sites)
    width = max((int(s.n_heads) * int(s.head_dim) for s in sites), default=1)
    return max(len(sites), 1), max(width, 1)
