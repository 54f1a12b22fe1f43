"""The step scale's spectral and edge measurements of one signal (pure numpy)."""

from __future__ import annotations

import math

import numpy as np

from exporter.analysis.signal import hann, parabolic, percentile, wrap

_HARMONICS = 4  # harmonics (besides the fundamental) counted in peak_concentration
_PEAK_HALF_WIDTH = 2  # bins either side of a peak: the main lobe of a Hann window
EDGE_RATIO = 0.9  # a peak above this share of the band's top is "at its edge": unresolved


def spectra_features(x: np.ndarray, fs: float, band: tuple[float, float], f_max: float
                     ) -> list[tuple[float | None, float, float]]:
    """Per row of ``x`` (M, N), one FFT for all rows: dominant frequency (searched up to
    f_max), peak concentration and band energy.

    ``x`` is detrended.  The search runs over every bin from two cycles per
    window up to ``f_max``: callers pass the sampling's Nyquist frequency and
    judge afterwards whether the peak lies inside the observable band, so a
    swing faster than the band is never replaced by a lesser, slower peak.
    """
    n = x.shape[1]
    spec = np.abs(np.fft.rfft(x * hann(n), axis=1)) ** 2
    freqs = np.arange(spec.shape[1]) * fs / n
    in_band = (freqs >= band[0]) & (freqs <= band[1])
    ac_all = spec[:, 1:].sum(axis=1).tolist()
    k_min = 2  # at least two cycles in the window; below is the slow trend
    k_max = min(spec.shape[1] - 2, int(math.floor(f_max * n / fs)))
    out: list[tuple[float | None, float, float]] = []
    for row, ac in zip(spec, ac_all, strict=True):
        if ac <= 0 or not math.isfinite(ac):
            out.append((None, 0.0, 0.0))
            continue
        # per row: spec[:, in_band] is column-major, so its row sums round differently
        band_ratio = float(row[in_band].sum()) / ac
        if k_max < k_min:
            out.append((None, 0.0, band_ratio))
            continue
        k = _fundamental(row, k_min, k_max)
        ls = np.log(row[k - 1:k + 2] + 1e-300).tolist()
        k_ref = k + parabolic(ls[0], ls[1], ls[2])
        near = np.zeros(row.size, dtype=bool)
        for h in range(1, _HARMONICS + 2):
            c = int(round(k_ref * h))
            if c - _PEAK_HALF_WIDTH >= row.size:
                break
            near[max(1, c - _PEAK_HALF_WIDTH):c + _PEAK_HALF_WIDTH + 1] = True
        out.append((k_ref * fs / n, float(row[near].sum()) / ac, band_ratio))
    return out


def _fundamental(spec: np.ndarray, k_min: int, k_max: int) -> int:
    """The highest bin, or a sub-harmonic of it with a real peak of its own.

    Pulse trains with a short duty cycle can put as much energy at 2f as at f.
    """
    k = k_min + int(np.argmax(spec[k_min:k_max + 1]))
    for m in (4, 3, 2):
        ks = int(round(k / m))
        if ks < k_min:
            continue
        lo, hi = max(k_min, ks - 1), min(k_max, ks + 1)
        kk = lo + int(np.argmax(spec[lo:hi + 1]))
        if (spec[kk] >= 0.3 * spec[k] and spec[kk] >= spec[kk - 1]
                and spec[kk] >= spec[kk + 1]):
            return kk
    return k


def phase(x: np.ndarray, t_rel: np.ndarray, f: float) -> float:
    """phi of cos(2 pi f t_rel + phi) in a detrended signal (Hann-weighted projection)."""
    return phases(x[None, :], t_rel, f)[0]


def phases(x: np.ndarray, t_rel: np.ndarray, f: float) -> list[float]:
    """:func:`phase` of each row of ``x`` (M, N), all at the frequency f."""
    c = (hann(x.shape[1]) * x * np.exp(-2j * np.pi * f * t_rel)).sum(axis=-1)
    return [wrap(a) for a in np.angle(c).tolist()]


def edge_frequency(x: np.ndarray, fs: float,
                   levels: tuple[float, float] | None = None) -> float | None:
    """Rising edges per second while the signal swings: 1 / the median time between
    upward crossings of 75 % of p5-p95 (each after a dip below 25 %).

    The hysteresis ignores noise around the midpoint; the median interval keeps
    a swing that fills only part of the window (or pauses in it) at its own
    rate.  None for a flat signal or fewer than three rises (too few to time).
    ``levels``: x's (p5, p95) when the caller has them already.
    """
    p5, p95 = levels if levels is not None else percentile(x, [5, 95])
    return edge_frequencies(x[None, :], fs, np.array([p5]), np.array([p95]))[0]


def edge_frequencies(x: np.ndarray, fs: float, p5: np.ndarray, p95: np.ndarray
                     ) -> list[float | None]:
    """:func:`edge_frequency` of each row of ``x`` (M, N), given each row's p5 and p95."""
    m, n = x.shape
    span = p95 - p5
    hi, lo = (p5 + 0.75 * span)[:, None], (p5 + 0.25 * span)[:, None]
    side = np.where(x >= hi, 1, np.where(x <= lo, -1, 0))
    rows, cols = np.nonzero(side)  # row by row, in time order
    marks = side[rows, cols]
    rise = (marks[1:] == 1) & (marks[:-1] == -1) & (rows[1:] == rows[:-1])
    rise_rows, rise_cols = rows[1:][rise], cols[1:][rise]
    bounds = np.searchsorted(rise_rows, np.arange(m + 1)).tolist()
    out: list[float | None] = []
    for r, s in enumerate(span.tolist()):
        rises = rise_cols[bounds[r]:bounds[r + 1]]
        if s <= 0 or n < 4 or rises.size < 3:
            out.append(None)
            continue
        gaps = np.sort(np.diff(rises))
        median = (gaps[(gaps.size - 1) // 2] + gaps[gaps.size // 2]) / 2  # as np.median
        out.append(fs / float(median))
    return out


def frequency_consistent(f: float, edges_hz: float | None) -> bool:
    """Do the edges seen fit a period of 1/f?

    One rise per period for a simple swing; 2-4 for a step with several phases
    (each a harmonic of f).  Fewer rises than periods, or a count between
    multiples, means f is not the signal's period.  No edges to count: no
    contradiction.
    """
    if edges_hz is None or f <= 0:
        return True
    r = edges_hz / f
    m = max(1, round(r))
    return r >= 0.8 and m <= 4 and abs(r - m) <= 0.2 * m
