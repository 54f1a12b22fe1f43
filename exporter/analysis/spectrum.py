"""The step scale's spectral and edge measurements of one signal (pure numpy)."""

from __future__ import annotations

import math

import numpy as np

from exporter.analysis.signal import hann, parabolic, wrap

_HARMONICS = 4  # harmonics (besides the fundamental) counted in peak_concentration
_PEAK_HALF_WIDTH = 2  # bins either side of a peak: the main lobe of a Hann window
EDGE_RATIO = 0.9  # a peak above this share of the band's top is "at its edge": unresolved


def spectrum_features(x: np.ndarray, fs: float, band: tuple[float, float],
                      f_max: float) -> tuple[float | None, float, float]:
    """Dominant frequency (searched up to f_max), peak concentration and band energy.

    ``x`` is detrended.  The search runs over every bin from two cycles per
    window up to ``f_max``: callers pass the sampling's Nyquist frequency and
    judge afterwards whether the peak lies inside the observable band, so a
    swing faster than the band is never replaced by a lesser, slower peak.
    """
    n = x.size
    spec = np.abs(np.fft.rfft(x * hann(n))) ** 2
    freqs = np.arange(spec.size) * fs / n
    ac = float(spec[1:].sum())
    if ac <= 0 or not np.isfinite(ac):
        return None, 0.0, 0.0
    in_band = (freqs >= band[0]) & (freqs <= band[1])
    band_ratio = float(spec[in_band].sum() / ac)
    k_min = 2  # at least two cycles in the window; below is the slow trend
    k_max = min(spec.size - 2, int(math.floor(f_max * n / fs)))
    if k_max < k_min:
        return None, 0.0, band_ratio
    k = _fundamental(spec, k_min, k_max)
    ls = np.log(spec[k - 1:k + 2] + 1e-300)
    k_ref = k + parabolic(float(ls[0]), float(ls[1]), float(ls[2]))
    near = np.zeros(spec.size, dtype=bool)
    for h in range(1, _HARMONICS + 2):
        c = int(round(k_ref * h))
        if c - _PEAK_HALF_WIDTH >= spec.size:
            break
        near[max(1, c - _PEAK_HALF_WIDTH):c + _PEAK_HALF_WIDTH + 1] = True
    return k_ref * fs / n, float(spec[near].sum() / ac), band_ratio


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
    w = hann(x.size)
    c = np.sum(w * x * np.exp(-2j * np.pi * f * t_rel))
    return wrap(float(np.angle(c)))


def edge_frequency(x: np.ndarray, fs: float,
                   levels: tuple[float, float] | None = None) -> float | None:
    """Rising edges per second while the signal swings: 1 / the median time between
    upward crossings of 75 % of p5-p95 (each after a dip below 25 %).

    The hysteresis ignores noise around the midpoint; the median interval keeps
    a swing that fills only part of the window (or pauses in it) at its own
    rate.  None for a flat signal or fewer than three rises (too few to time).
    ``levels``: x's (p5, p95) when the caller has them already.
    """
    p5, p95 = levels if levels is not None else np.percentile(x, [5, 95])
    span = float(p95 - p5)
    if span <= 0 or x.size < 4:
        return None
    state = np.where(x >= p5 + 0.75 * span, 1, np.where(x <= p5 + 0.25 * span, -1, 0))
    where = np.flatnonzero(state)
    marks = state[where]
    rises = where[1:][(marks[1:] == 1) & (marks[:-1] == -1)]
    if rises.size < 3:
        return None
    return fs / float(np.median(np.diff(rises)))


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
