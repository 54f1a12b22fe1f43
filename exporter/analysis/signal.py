"""Small numpy helpers shared by the power analysers: grids, trends, smoothing, synchrony."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np


# np.median without numpy.ma. Every np.median of a non-empty array asks np.ma.isMaskedArray
# in its NaN check, and every np.percentile np.ma.is_masked (in np.unique): that imports
# numpy.ma (~1 MiB resident) into a process that has no masked array. `median` is numpy's
# own computation otherwise: the middle element, or the mean of the middle two, of a
# partition that also puts a NaN (which sorts last) at the end, so any NaN makes the
# median NaN; `percentile` below is the same for np.percentile. Their values are numpy's,
# bit for bit (tests/test_median.py).
def median(a: Any, axis: int | None = None, overwrite_input: bool = False) -> Any:
    """np.median(a, axis=axis) for a 1-D or N-D array or sequence; with `overwrite_input`
    a 1-D array is partitioned in place (no copy the length of the input)."""
    x = np.asanyarray(a)
    if axis is None:
        x, axis = x.ravel(), 0
    n = x.shape[axis]
    if n == 0 or x.dtype.kind not in "fiu":
        return np.median(x, axis=axis)  # numpy's warning and NaN (it checks no mask then)
    half = n // 2
    kth = [half - 1, half, n - 1] if n % 2 == 0 else [half, n - 1]
    if overwrite_input and x.ndim == 1:
        x.partition(kth)
        part = x
    else:
        part = np.partition(x, kth, axis=axis)
    middle = part.take(range(half - 1 + n % 2, half + 1), axis=axis)
    result = middle.mean(axis=axis)
    if x.dtype.kind == "f":
        nan = np.isnan(part.take(n - 1, axis=axis))
        if np.ndim(nan) == 0:
            return result.dtype.type(np.nan) if nan else result
        if nan.any():
            result[nan] = np.nan
    return result


def amplitude_share(amplitude_watts: float, mean_watts: float, of_tdp: float | None
                    ) -> float:
    """A swing's amplitude as a share of the power limit (`of_tdp`, where known), else
    of the observed peak (the mean plus half the amplitude): what the amplitude
    thresholds compare with."""
    if of_tdp is not None:
        return of_tdp
    peak = mean_watts + amplitude_watts / 2
    return amplitude_watts / peak if peak > 0 else 0.0


def sample_interval(t: np.ndarray) -> float:
    """Median spacing of strictly increasing sample times."""
    d = np.diff(np.asarray(t, dtype=np.float64))
    if not (d > 0).all():
        d = d[d > 0]
    if d.size == 0:
        raise ValueError("need at least two distinct sample times")
    return float(median(d, overwrite_input=True))  # d is ours: no copy to sort


def stretch_starts(valid: np.ndarray, n_win: int, n_step: int, *, tail: bool
                   ) -> list[int | None]:
    """Starts of windows of ``n_win`` samples laid within each stretch of ``valid`` samples
    (a trace's grid between its gaps), every ``n_step`` from the stretch's start, and
    with ``tail`` one more that ends with the stretch; None between two stretches (a
    pattern must not run across a gap). A stretch shorter than a window holds none."""
    edges = np.diff(np.concatenate([[0], np.asarray(valid, dtype=np.int8), [0]]))
    out: list[int | None] = []
    for lo, hi in zip(np.flatnonzero(edges == 1).tolist(),
                      np.flatnonzero(edges == -1).tolist(), strict=True):
        if hi - lo < n_win:
            continue
        starts = list(range(lo, hi - n_win + 1, n_step))
        if tail and starts[-1] + n_win < hi:
            starts.append(hi - n_win)
        if out:
            out.append(None)
        out += starts
    return out


def resample(t: np.ndarray, power: np.ndarray, dt: float | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Linear interpolation of (N, M) power sampled at t onto a uniform grid.

    NaNs are left out per row; a row with fewer than two valid samples becomes
    all-NaN.  The grid spans [t[0], t[-1]] with the median spacing unless given.
    """
    t = np.asarray(t, dtype=np.float64)
    power = np.atleast_2d(np.asarray(power, dtype=np.float64))
    if power.shape[1] != t.shape[0]:
        raise ValueError(f"power has {power.shape[1]} samples per GPU, t has {t.shape[0]}")
    step = dt if dt is not None else sample_interval(t)
    n = int(math.floor((t[-1] - t[0]) / step + 1e-9)) + 1
    # relative times keep the interpolation exact for 1.7e9 s timestamps
    rel = t - t[0]
    uniform = n == t.size and all(
        np.allclose(rel[a:a + _BLOCK], _grid_part(a, n, step), rtol=0, atol=step * 1e-6)
        for a in range(0, n, _BLOCK))
    out = np.empty((power.shape[0], n))
    for i, row in enumerate(power):
        ok = np.isfinite(row)
        every = bool(ok.all())
        if every and uniform:
            out[i] = row
        elif every or ok.sum() >= 2:
            xp, fp = (rel, row) if every else (rel[ok], row[ok])  # no copies for nothing
            # a block of grid times at a time: np.interp makes no slope array then, and
            # each value is the one the whole grid's call gives
            for a in range(0, n, _BLOCK):
                out[i, a:a + _BLOCK] = np.interp(_grid_part(a, n, step), xp, fp)
        else:
            out[i] = np.nan
    del rel
    grid = np.arange(n, dtype=np.float64)  # t[0] + np.arange(n) * step, made in place
    grid *= step
    grid += t[0]
    return grid, out


_BLOCK = 1 << 16  # grid times interpolated at a time


def _grid_part(a: int, n: int, step: float) -> np.ndarray:
    """(np.arange(n) * step)[a:a + _BLOCK], made alone."""
    return np.arange(a, min(n, a + _BLOCK)) * step


def detrend(x: np.ndarray) -> np.ndarray:
    """Remove the least-squares line along the last axis."""
    n = x.shape[-1]
    u = np.arange(n) - (n - 1) / 2
    denom = float(u @ u) or 1.0
    slope = (x @ u) / denom
    return x - x.mean(axis=-1, keepdims=True) - slope[..., None] * u


def percentiles(x: np.ndarray, q: list[float]) -> np.ndarray:
    """np.percentile(x, q, axis=-1) of finite x, bit for bit (its default, linear method).

    One sort along the last axis: np.percentile partitions along the first (it moves
    the axis there), which costs several times more on a few rows of a window.
    """
    n = x.shape[-1]
    virtual = (n - 1) * (np.asarray(q, dtype=np.float64) / 100)
    below = np.floor(virtual)
    gamma = (virtual - below).reshape((-1,) + (1,) * (x.ndim - 1))
    i = np.minimum(below.astype(np.intp), n - 1)
    j = np.minimum(i + 1, n - 1)
    ordered = np.sort(x, axis=-1)
    a, b = np.moveaxis(ordered[..., i], -1, 0), np.moveaxis(ordered[..., j], -1, 0)
    diff = b - a
    return np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)


def percentile(a: Any, q: Any, axis: int = -1) -> Any:
    """np.percentile(a, q, axis=axis), its default (linear) method, without numpy.ma
    (see median): `percentiles` for finite float64 data, numpy's for the rest."""
    x = np.asarray(a)
    if x.dtype != np.float64 or x.size == 0 or not np.isfinite(x).all():
        return np.percentile(x, q, axis=axis)  # what the live analyses never pass
    qs = np.asarray(q, dtype=np.float64)
    out = percentiles(np.moveaxis(x, axis, -1), np.atleast_1d(qs).tolist())
    return out[0] if qs.ndim == 0 else out


def detrend_rows(x: np.ndarray) -> np.ndarray:
    """:func:`detrend` of each row of x (M, N), bit for bit what it gives for the row
    alone: a matrix-vector product rounds otherwise than a row's dot product."""
    n = x.shape[-1]
    u = np.arange(n) - (n - 1) / 2
    denom = float(u @ u) or 1.0
    slope = np.array([row @ u for row in x]) / denom
    return x - x.mean(axis=-1, keepdims=True) - slope[:, None] * u


def parabolic(y_m: float, y_0: float, y_p: float) -> float:
    """Offset (-0.5..0.5) of a peak's vertex from its middle sample."""
    den = y_m - 2 * y_0 + y_p
    return 0.0 if den == 0 else float(np.clip(0.5 * (y_m - y_p) / den, -0.5, 0.5))


def moving_average(x: np.ndarray, k: int) -> np.ndarray:
    """Means of k consecutive samples along the last axis (length n - k + 1)."""
    if k <= 1:
        return x
    c = np.cumsum(np.concatenate([np.zeros(x.shape[:-1] + (1,)), x], axis=-1), axis=-1)
    return (c[..., k:] - c[..., :-k]) / k


def smoothing_samples(fs: float) -> int:
    """~150 ms of samples: 3 at 20 Hz, none below ~7 Hz."""
    return max(1, int(round(0.15 * fs)))


def block_mean(x: np.ndarray, k: int) -> np.ndarray:
    """Means of consecutive blocks of k samples along the last axis (the tail is dropped)."""
    m = x.shape[-1] // k
    return x[..., : m * k].reshape(*x.shape[:-1], m, k).mean(axis=-1)


def synchrony(power: np.ndarray) -> float:
    """var(sum P) / (N * sum var P) over the rows of ``power`` (N, M).

    1 when all N GPUs swing in phase with equal amplitude, about 1/N when they are
    independent, 0 when they cancel; always in [0, 1] (Cauchy-Schwarz).  Rows are
    linearly detrended first.  One GPU gives 1; a flat node gives 0.
    """
    x = detrend(np.atleast_2d(power))
    n = x.shape[0]
    var_each = x.var(axis=1)
    total = float(var_each.sum())
    if not np.isfinite(total) or total <= 1e-12 * max(1.0, float(np.abs(power).max()) ** 2):
        return 0.0
    return float(np.clip(x.sum(axis=0).var() / (n * total), 0.0, 1.0))


def wrap(phi: float) -> float:
    """Angle in (-pi, pi]."""
    w = math.remainder(phi, 2 * math.pi)
    return math.pi if w <= -math.pi else w


@functools.lru_cache(maxsize=16)
def hann(n: int) -> np.ndarray:
    """np.hanning(n), made once per length (the live analyses ask for the same few)."""
    window = np.hanning(n)
    window.flags.writeable = False
    return window


class ColumnBlocks:
    """An (N, M) grid never held whole: ``[:, a:b]`` gives that block of columns, made
    ``block_columns`` at a time by ``block(a, b)`` and kept for the reads within it (the
    block before is let go before the next is made). Subclasses set ``shape`` and
    ``block_columns`` and make a block."""

    shape: tuple[int, int]
    block_columns: int
    _cached: tuple[int, int, np.ndarray] | None = None

    def block(self, a: int, b: int) -> np.ndarray:
        """Columns a..b-1 (a new array)."""
        raise NotImplementedError

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        rows, cols = key
        a, b, step = cols.indices(self.shape[1])
        b = max(a, b)  # an empty read
        if rows != slice(None) or step != 1:
            raise IndexError(f"a {type(self).__name__} is read as [:, a:b]")
        c = self._cached
        if c is None or not (c[0] <= a and b <= c[1]):
            self._cached = None
            stop = max(b, min(self.shape[1], a + self.block_columns))
            c = self._cached = (a, stop, self.block(a, stop))
        return c[2][:, a - c[0]:b - c[0]]
