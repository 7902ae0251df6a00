"""Decimation keeps what a reader looks for (extremes, spikes, NaN stretches) within its budget."""

import pytest
import numpy as np

from diagnose.reports._decimate import bin_mean, minmax
from ..tolerance import F64, approx

pytestmark = pytest.mark.numerics


def test_short_series_untouched():
    x, y = np.arange(10.0), np.random.default_rng(0).normal(size=10)
    dx, dy = minmax(x, y, 100)
    assert np.array_equal(dx, x) and np.array_equal(dy, y)


def test_keeps_spike_extremes_and_bounded_size():
    rng = np.random.default_rng(0)
    y = rng.normal(size=20_000)
    y[12_345] = 50.0
    y[777] = -40.0
    x = np.arange(len(y), dtype=float)
    dx, dy = minmax(x, y, 2000)
    assert len(dy) <= 2002
    assert 12_345 in dx and 777 in dx
    assert dy.max() == 50.0 and dy.min() == -40.0
    assert np.all(np.diff(dx) > 0), "order preserved"
    # every bin's extremes survive: max of each original 20-point bin is present
    for lo in range(0, 20_000, 20):
        assert y[lo:lo + 20].max() in dy


def test_nonfinite_stretch_bounded_and_marked():
    y = np.linspace(3, 1, 20_000)
    y[15_000:] = np.nan
    x = np.arange(len(y), dtype=float)
    dx, dy = minmax(x, y, 2000)
    assert len(dy) <= 2004
    bad = dx[~np.isfinite(dy)]
    assert bad.min() == 15_000 and bad.max() == 19_999


def test_bin_mean_matches_direct_means():
    values = np.arange(1000, dtype=float).reshape(500, 2)  # [T, 2]
    values[3, 1] = np.nan
    x = np.arange(500, dtype=float)
    bx, bv = bin_mean(x, values, 100)
    assert bv.shape == (100, 2)
    assert bx[0] == approx(x[:5].mean(), dtype=F64, width=5)
    assert bv[0, 0] == approx(values[:5, 0].mean(), dtype=F64, width=5)
    assert bv[0, 1] == approx(np.nanmean(values[:5, 1]), dtype=F64, width=5)
