"""Shrinking long curves for the page without hiding what matters in them.

A 20,000-step run has more points than a plot has pixels. Plain striding would drop exactly
the spikes a reader is looking for, so lines keep each bin's minimum and maximum (and every
non-finite point), and heat maps over time average within bins.
"""

from __future__ import annotations

import numpy as np


def minmax(x: np.ndarray, y: np.ndarray, max_points: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """At most ~max_points of (x, y), keeping each bin's min and max in their original order.

    Non-finite y values (NaN, inf) stay visible: the first and last point of every non-finite
    stretch are kept, so the line breaks exactly where the loss went NaN and resumes where it did.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n = len(y)
    if n <= max_points:
        return x, y
    n_bins = max(1, max_points // 2)
    edges = np.linspace(0, n, n_bins + 1).astype(int)
    finite = np.isfinite(y)
    keep = np.zeros(n, dtype=bool)
    edge = np.diff(np.concatenate([[True], finite, [True]]).astype(np.int8))  # -1 starts, +1 ends a bad run
    keep[np.flatnonzero(edge[:-1] == -1)] = True
    keep[np.flatnonzero(edge[1:] == 1)] = True
    keep[0] = keep[-1] = True
    for lo, hi in zip(edges[:-1], edges[1:]):
        if hi <= lo:
            continue
        seg = np.where(finite[lo:hi], y[lo:hi], np.nan)
        if np.isnan(seg).all():
            continue
        keep[lo + int(np.nanargmin(seg))] = True
        keep[lo + int(np.nanargmax(seg))] = True
    return x[keep], y[keep]


def bin_mean(x: np.ndarray, values: np.ndarray, max_bins: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """values [T, ...] averaged over consecutive bins along T (NaN ignored) -> (x centres, [bins, ...])."""
    x = np.asarray(x, dtype=float)
    values = np.asarray(values, dtype=float)
    n = len(x)
    if n <= max_bins:
        return x, values
    edges = np.linspace(0, n, max_bins + 1).astype(int)
    xs, out = [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        if hi <= lo:
            continue
        seg = values[lo:hi]
        with np.errstate(invalid="ignore"):
            finite = np.isfinite(seg)
            total = np.where(finite, seg, 0.0).sum(0)
            count = finite.sum(0)
            out.append(np.where(count > 0, total / np.maximum(count, 1), np.nan))
        xs.append(x[lo:hi].mean())
    return np.asarray(xs), np.stack(out)
