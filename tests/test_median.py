"""exporter.analysis.signal's median and percentile: np.median's and np.percentile's
values, bit for bit, without importing numpy.ma."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from exporter.analysis.signal import median


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 10, 101, 1000])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.uint32])
def test_the_values_are_numpys(n, dtype):
    values = (np.arange(n) * 7919 % 1009 - 300).astype(dtype)
    values = values * dtype(3) / dtype(7) if values.dtype.kind == "f" else values
    assert _same(median(values), np.median(values))
    assert _same(median(list(values)), np.median(list(values)))


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("shape", [(3, 5), (4, 6), (1, 1), (8, 1200)])
def test_along_an_axis(axis, shape):
    grid = np.sin(np.arange(np.prod(shape)) * 0.37).reshape(shape) * 1e3
    assert _same(median(grid, axis=axis), np.median(grid, axis=axis))


def test_a_nan_makes_its_median_nan_as_numpy_does():
    x = np.array([1.0, np.nan, 3.0, 2.0])
    assert np.isnan(median(x)) and _same(median(x), np.median(x))
    grid = np.array([[1.0, 2.0, 3.0], [4.0, np.nan, 6.0], [np.inf, 1.0, -np.inf]])
    for axis in (0, 1):
        assert _same(median(grid, axis=axis), np.median(grid, axis=axis))


def test_an_empty_array_is_numpys_warning_and_nan():
    with pytest.warns(RuntimeWarning):
        assert np.isnan(median(np.array([])))


def test_it_does_not_import_numpy_ma():
    code = ("import sys, numpy as np\nfrom exporter.analysis.signal import median\n"
            "median(np.array([3.0, 1.0, 2.0, np.nan]))\n"
            "median(np.ones((4, 5)), axis=1)\nprint('numpy.ma' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("q", [95.0, [5, 95], [1, 99], [0, 50, 100], 37.5])
@pytest.mark.parametrize("shape,axis", [((1,), -1), ((7,), -1), ((600,), 0), ((8, 120), 1),
                                        ((8, 120), -1), ((5, 3), 0)])
def test_percentile_is_numpys(q, shape, axis):
    from exporter.analysis.signal import percentile

    x = np.cos(np.arange(np.prod(shape)) * 1.7).reshape(shape) * 300 + 400
    assert _same(percentile(x, q, axis=axis), np.percentile(x, q, axis=axis))


def test_percentile_of_nan_inf_or_other_types_is_numpys_own():
    from exporter.analysis.signal import percentile

    for x in (np.array([1.0, np.nan, 3.0]), np.array([1.0, np.inf, 3.0, -np.inf]),
              np.arange(10, dtype=np.int64), np.arange(10, dtype=np.float32)):
        assert _same(percentile(x, [5, 95]), np.percentile(x, [5, 95]))
    with pytest.raises(IndexError):
        percentile(np.array([]), 50)
