"""The cycle scale: slow periodic patterns of a node's power (checkpoints, evaluation).

See :func:`analyse_cycles` and docs/power.md.  Pure numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from exporter.analysis.signal import (
    block_mean,
    median,
    parabolic,
    resample,
    sample_interval,
    synchrony,
)


@dataclass(frozen=True)
class CycleFeatures:
    """A slow periodic pattern of the node's power (result of :func:`analyse_cycles`)."""

    period_seconds: float
    frequency_hz: float
    strength: float  # autocorrelation of the (clipped) power changes at the period, 0-1
    amplitude_watts: float  # max - min of the node's mean cycle (power folded at the period)
    amplitude_ratio: float | None  # of the node's summed TDP
    gpu_amplitude_watts: dict[int, float]
    duty_cycle: float  # share of the mean cycle above its midpoint
    synchrony: float  # same definition as NodeSwing.synchrony, on the mean cycles
    max_ramp_watts_per_second: float


def analyse_cycles(
    t: np.ndarray,
    power: np.ndarray,
    tdp_watts: np.ndarray | None = None,
    *,
    min_period_seconds: float = 10.0,
    max_period_seconds: float | None = None,
    resolution_seconds: float = 0.5,
    min_strength: float = 0.3,
    measured: np.ndarray | None = None,
) -> CycleFeatures | None:
    """Find a slow periodic pattern (e.g. checkpoints) in a long window (~10 min).

    ``power`` is (N, len(t)) per GPU (one row is fine).  The node's power is
    resampled to ``resolution_seconds`` (or the sample interval, if coarser), and
    its sample-to-sample changes, clipped at their 98th percentile so that a
    one-off level change (job start, stop) weighs no more than one cycle edge,
    are autocorrelated.  The period is the strongest autocorrelation peak between
    ``min_period_seconds`` and ``max_period_seconds`` (default: a quarter of the
    window, so at least four cycles), preferring a sub-multiple that is almost as
    strong (>= 60 %).  The amplitude comes from the node's power folded at that period.
    Returns None when no peak reaches ``min_strength``.

    ``measured`` (len(t), on a uniform grid): False where the grid was interpolated
    across a hole in the samples (analysis.bridging): only the measured samples are
    folded, each less the mean of its period, and the period comes from the mean of two
    autocorrelations, of the measured changes alone and of the changes along the line.
    """
    power = np.atleast_2d(np.asarray(power, dtype=np.float64))
    t = np.asarray(t, dtype=np.float64)
    if t.size < 8:
        return None
    dt_native = sample_interval(t)
    k = max(1, int(round(resolution_seconds / dt_native)))
    _, x = resample(t, power)
    ok = np.isfinite(x).all(axis=1)
    if not ok.any():
        return None
    keep = None
    if measured is not None and np.size(measured) == x.shape[1] and not np.all(measured):
        keep = block_mean(np.asarray(measured, dtype=np.float64)[None, :], k)[0] >= 0.5
    x = block_mean(x[ok], k)
    dt = dt_native * k
    node = x.sum(axis=0)
    span = node.size * dt
    max_p = max_period_seconds if max_period_seconds is not None else span / 4
    lag_min = max(2, int(math.ceil(min_period_seconds / dt)))
    lag_max = min(node.size // 2, int(math.floor(max_p / dt)))
    if lag_max <= lag_min + 1:
        return None
    k_edges = max(8, 2 * int(span / max_p))
    acf = _change_autocorrelation(node, k_edges)
    if keep is not None and acf is not None:
        # with holes, the measured changes alone and the line across the holes each miss
        # edges in their own way (a hole pattern that beats with the period starves one
        # lag of measured pairs; the line smears edges): both weigh in
        masked = _change_autocorrelation(node, k_edges, keep)
        acf = acf if masked is None else (acf + masked) / 2
    if acf is None:
        return None
    found = _pick_lag(acf, lag_min, lag_max, min_strength)
    if found is None:
        return None
    lag, strength = found
    tdp = None if tdp_watts is None else np.asarray(tdp_watts, dtype=np.float64).reshape(-1)
    node_tdp = float(tdp[ok].sum()) if tdp is not None and np.isfinite(tdp[ok]).all() else None
    ids = [i for i in range(power.shape[0]) if ok[i]]
    return _fold(x, ids, lag * dt, dt, strength, node_tdp, keep)


def _change_autocorrelation(node: np.ndarray, k_edges: int, keep: np.ndarray | None = None
                            ) -> np.ndarray | None:
    """Unbiased, normalised autocorrelation of the node's clipped sample-to-sample changes.

    Clipped at the k_edges-th largest change, k_edges being the fewest edges a
    cycle of the longest period leaves in the window: one-off steps then weigh
    no more than an edge.  With ``keep`` (the measured samples), only the changes
    between two measured samples count: the line across a hole is made up.
    """
    d = np.diff(node)
    seen = np.ones(d.size, dtype=bool) if keep is None else keep[1:] & keep[:-1]
    if seen.sum() <= k_edges:
        return None
    d = d - median(d[seen])
    mag = np.abs(d[seen])
    cap = float(np.partition(mag, mag.size - k_edges)[mag.size - k_edges]) \
        if mag.size > k_edges else float(mag.max())
    if cap <= 0:
        return None
    d = np.clip(d, -cap, cap)
    d = np.where(seen, d - d[seen].mean(), 0.0)
    m = d.size
    nfft = 1 << (2 * m - 1).bit_length()
    acf = np.fft.irfft(np.abs(np.fft.rfft(d, nfft)) ** 2, nfft)[:m]
    if keep is None:
        pairs = m - np.arange(m, dtype=np.float64)
    else:  # the pairs of seen changes at each lag
        w = seen.astype(np.float64)
        pairs = np.round(np.fft.irfft(np.abs(np.fft.rfft(w, nfft)) ** 2, nfft)[:m])
    if acf[0] <= 0:
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(pairs > 0, acf / np.maximum(pairs, 1.0), 0.0)
    return out / out[0]


def _pick_lag(acf: np.ndarray, lag_min: int, lag_max: int, min_strength: float
              ) -> tuple[float, float] | None:
    """(lag in samples, refined; strength) of the period, or None."""
    seg = acf[lag_min:lag_max + 1]
    is_peak = np.zeros(seg.size, dtype=bool)
    is_peak[1:-1] = (seg[1:-1] >= seg[:-2]) & (seg[1:-1] > seg[2:])
    if not is_peak.any():
        return None
    peaks = np.flatnonzero(is_peak) + lag_min
    best = int(peaks[np.argmax(acf[peaks])])
    strength = float(acf[best])
    if strength < min_strength:
        return None
    # the smallest lag nearly as strong (>= 60 %) that divides it is the fundamental;
    # if that lies below min_period, the pattern is a faster swing (the step scale's)
    short = np.arange(2, lag_min)
    short = short[(acf[short] >= acf[short - 1]) & (acf[short] > acf[short + 1])]
    for p in [*short.tolist(), *peaks.tolist()]:
        mult = round(best / p)
        if p < best and acf[p] >= 0.6 * strength and abs(best - mult * p) <= max(1, 0.03 * best):
            if p < lag_min:
                return None
            best = int(p)
            break
    lag = best + parabolic(float(acf[best - 1]), float(acf[best]), float(acf[best + 1]))
    return lag, strength


def _fold(x: np.ndarray, ids: list[int], period: float, dt: float, strength: float,
          node_tdp: float | None, keep: np.ndarray | None = None) -> CycleFeatures:
    """Fold every GPU at the period (the mean cycle) and measure it; with ``keep``, only
    those samples (the measured ones)."""
    node = x.sum(axis=0)
    n = node.size
    # with holes, bins as much wider as samples are missing: each holds as many samples
    # as without (fewer would make the profile's max - min grow with its noise)
    share = 1.0 if keep is None else max(float(np.mean(keep)), 1e-3)
    nbins = max(4, int(round(period / dt * share)))
    phase_bin = np.floor((np.arange(n) * dt / period % 1.0) * nbins).astype(int) % nbins
    if keep is not None:
        # the samples a bin keeps come from some cycles only: each sample less the mean of
        # the period around it, so the level of the cycles it happens to keep (the node's
        # power drifts by more than a cycle's swing over minutes) does not move the bin
        level = x.mean(axis=1, keepdims=True)
        x = x - _period_mean(x, max(2, int(round(period / dt)))) + level
        phase_bin, x = phase_bin[keep], x[:, keep]
    counts = np.bincount(phase_bin, minlength=nbins).astype(float)
    counts[counts == 0] = np.nan
    prof = np.stack([np.bincount(phase_bin, weights=row, minlength=nbins) for row in x]) / counts
    prof = prof[:, np.isfinite(counts)]
    node_prof = prof.sum(axis=0)
    amp = float(node_prof.max() - node_prof.min())
    mid = (node_prof.max() + node_prof.min()) / 2
    return CycleFeatures(
        period_seconds=float(period),
        frequency_hz=float(1.0 / period),
        strength=min(1.0, strength),
        amplitude_watts=amp,
        amplitude_ratio=amp / node_tdp if node_tdp else None,
        gpu_amplitude_watts={g: float(r.max() - r.min()) for g, r in zip(ids, prof, strict=True)},
        duty_cycle=float(np.mean(node_prof > mid)),
        synchrony=synchrony(prof),
        max_ramp_watts_per_second=float(np.abs(np.diff(node)).max() / dt) if n > 1 else 0.0,
    )


def _period_mean(x: np.ndarray, w: int) -> np.ndarray:
    """The mean of the ``w`` samples centred on each one, along the last axis (fewer at the
    ends)."""
    kernel = np.ones(w)
    sums = np.stack([np.convolve(row, kernel, mode="same") for row in x])
    return sums / np.convolve(np.ones(x.shape[-1]), kernel, mode="same")
