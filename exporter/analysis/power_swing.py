"""Power swings: features of a node's GPU power over a window, as pure numpy.

Three scales (see docs/power.md):

- **step** (:func:`analyse_window`, ~30 s at ~20 Hz): step-synchronised swings
  at 0.1-3 Hz: amplitude, dominant frequency, band energy, ramp rate, duty
  cycle, synchrony of the node's GPUs, and the phase against wall-clock time;
  :class:`SwingDetector` turns consecutive windows into a held decision.
- **cycle** (:func:`analyse_cycles`, ~10 min): periodic patterns too slow for
  the step window (checkpoints, evaluation, data-loader stalls).
- **ramps** (:func:`detect_ramps`): single large synchronised rises and falls
  of the node's power (job start, stop, crash).

Nothing here knows about NVML, HTTP or Prometheus.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_BAND_HZ: tuple[float, float] = (0.1, 3.0)
_HARMONICS = 4  # harmonics (besides the fundamental) counted in peak_concentration
_PEAK_HALF_WIDTH = 2  # bins either side of a peak: the main lobe of a Hann window


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class SwingFeatures:
    """Features of one power signal (a GPU, or the node's sum) over a window."""

    mean_watts: float
    amplitude_watts: float  # p95 - p5
    amplitude_ratio: float | None  # amplitude / power limit; None when the limit is unknown
    frequency_hz: float | None  # dominant oscillation; None when the signal is flat
    peak_concentration: float  # share of AC energy at the dominant frequency and harmonics
    band_energy_ratio: float  # share of AC energy inside the band
    max_ramp_watts_per_second: float  # max |dP/dt| after ~150 ms smoothing
    duty_cycle: float  # share of time above (p5 + p95) / 2
    phase_radians: float | None  # phase of the node's dominant component, see NodeSwing


@dataclass(frozen=True)
class NodeSwing:
    """Result of :func:`analyse_window` for one node.

    ``phase_radians`` (node and GPUs, all at the node's dominant frequency f) is
    the phi in ``P(t) ~ mean + A cos(2 pi f (t - phase_reference_time) + phi)``,
    in (-pi, pi].  ``phase_reference_time`` is the last multiple of
    ``phase_grid_seconds`` of Unix time at or before the window's end, so nodes
    whose windows end in the same grid slot share the reference; see
    docs/power.md for why the reference is not the Unix epoch itself.
    """

    node: SwingFeatures
    gpus: dict[int, SwingFeatures]
    synchrony: float  # var(sum P) / (N * sum var P), in [0, 1]
    observable_band_hz: tuple[float, float]
    sample_rate_hz: float
    duration_seconds: float
    phase_reference_time: float
    candidate: bool  # this window alone meets the thresholds it was analysed with


@dataclass(frozen=True)
class SwingThresholds:
    """When a window counts as a power swing.  Defaults from docs/power.md."""

    min_amplitude_ratio: float = 0.20  # of the node's summed TDP (of its p95 if TDP unknown)
    band_hz: tuple[float, float] = DEFAULT_BAND_HZ
    min_band_energy_ratio: float = 0.20
    min_synchrony: float = 0.5

    def matches(self, ns: NodeSwing) -> bool:
        n = ns.node
        if n.frequency_hz is None:
            return False
        ratio = n.amplitude_ratio
        if ratio is None:  # no TDP: compare with the observed peak instead
            peak = n.mean_watts + n.amplitude_watts / 2
            ratio = n.amplitude_watts / peak if peak > 0 else 0.0
        lo, hi = self.band_hz
        return (
            ratio >= self.min_amplitude_ratio
            and lo <= n.frequency_hz <= hi
            and n.band_energy_ratio > self.min_band_energy_ratio
            and ns.synchrony >= self.min_synchrony
        )


class SwingDetector:
    """A swing is reported once ``hold`` consecutive windows match the thresholds."""

    def __init__(self, thresholds: SwingThresholds | None = None, hold: int = 3) -> None:
        if hold < 1:
            raise ValueError("hold must be at least 1")
        self.thresholds = thresholds or SwingThresholds()
        self.hold = hold
        self.streak = 0

    def update(self, ns: NodeSwing) -> bool:
        self.streak = self.streak + 1 if self.thresholds.matches(ns) else 0
        return self.streak >= self.hold

    def reset(self) -> None:
        self.streak = 0


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


@dataclass(frozen=True)
class Ramp:
    time: float  # seconds (same clock as the input t) at the middle of the ramp
    direction: str  # "rise" or "fall"
    delta_watts: float  # level after - level before (negative for a fall)
    duration_seconds: float  # 10 %-90 % of the change


# --------------------------------------------------------------------------- helpers


def sample_interval(t: np.ndarray) -> float:
    """Median spacing of strictly increasing sample times."""
    d = np.diff(np.asarray(t, dtype=np.float64))
    d = d[d > 0]
    if d.size == 0:
        raise ValueError("need at least two distinct sample times")
    return float(np.median(d))


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
    grid_rel = np.arange(n) * step
    uniform = bool(n == t.size and np.allclose(rel, grid_rel, rtol=0, atol=step * 1e-6))
    out = np.empty((power.shape[0], n))
    for i, row in enumerate(power):
        ok = np.isfinite(row)
        if ok.all() and uniform:
            out[i] = row
        elif ok.sum() >= 2:
            out[i] = np.interp(grid_rel, rel[ok], row[ok])
        else:
            out[i] = np.nan
    return t[0] + grid_rel, out


def _detrend(x: np.ndarray) -> np.ndarray:
    """Remove the least-squares line along the last axis."""
    n = x.shape[-1]
    u = np.arange(n) - (n - 1) / 2
    denom = float(u @ u) or 1.0
    slope = (x @ u) / denom
    return x - x.mean(axis=-1, keepdims=True) - slope[..., None] * u


def _parabolic(y_m: float, y_0: float, y_p: float) -> float:
    den = y_m - 2 * y_0 + y_p
    return 0.0 if den == 0 else float(np.clip(0.5 * (y_m - y_p) / den, -0.5, 0.5))


def _moving_average(x: np.ndarray, k: int) -> np.ndarray:
    if k <= 1:
        return x
    c = np.cumsum(np.concatenate([np.zeros(x.shape[:-1] + (1,)), x], axis=-1), axis=-1)
    return (c[..., k:] - c[..., :-k]) / k


def _smoothing_samples(fs: float) -> int:
    """~150 ms of samples: 3 at 20 Hz, none below ~7 Hz."""
    return max(1, int(round(0.15 * fs)))


def synchrony(power: np.ndarray) -> float:
    """var(sum P) / (N * sum var P) over the rows of ``power`` (N, M).

    1 when all N GPUs swing in phase with equal amplitude, about 1/N when they are
    independent, 0 when they cancel; always in [0, 1] (Cauchy-Schwarz).  Rows are
    linearly detrended first.  One GPU gives 1; a flat node gives 0.
    """
    x = _detrend(np.atleast_2d(power))
    n = x.shape[0]
    var_each = x.var(axis=1)
    total = float(var_each.sum())
    if not np.isfinite(total) or total <= 1e-12 * max(1.0, float(np.abs(power).max()) ** 2):
        return 0.0
    return float(np.clip(x.sum(axis=0).var() / (n * total), 0.0, 1.0))


def _wrap(phi: float) -> float:
    """Angle in (-pi, pi]."""
    w = math.remainder(phi, 2 * math.pi)
    return math.pi if w <= -math.pi else w


# --------------------------------------------------------------------------- step scale


def _spectrum_features(x: np.ndarray, fs: float, band: tuple[float, float],
                       f_max: float) -> tuple[float | None, float, float]:
    """Dominant frequency, peak concentration and band energy of a detrended signal."""
    n = x.size
    spec = np.abs(np.fft.rfft(x * np.hanning(n))) ** 2
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
    seg = spec[k_min:k_max + 1]
    k = k_min + int(np.argmax(seg))
    # prefer a sub-harmonic with a real peak of its own (pulse trains with a
    # short duty cycle can put as much energy at 2f as at f)
    for m in (4, 3, 2):
        ks = int(round(k / m))
        if ks < k_min:
            continue
        lo, hi = max(k_min, ks - 1), min(k_max, ks + 1)
        kk = lo + int(np.argmax(spec[lo:hi + 1]))
        if (spec[kk] >= 0.3 * spec[k] and spec[kk] >= spec[kk - 1]
                and spec[kk] >= spec[kk + 1]):
            k = kk
            break
    ls = np.log(spec[k - 1:k + 2] + 1e-300)
    k_ref = k + _parabolic(float(ls[0]), float(ls[1]), float(ls[2]))
    f = k_ref * fs / n
    near = np.zeros(spec.size, dtype=bool)
    for h in range(1, _HARMONICS + 2):
        c = int(round(k_ref * h))
        if c - _PEAK_HALF_WIDTH >= spec.size:
            break
        near[max(1, c - _PEAK_HALF_WIDTH):c + _PEAK_HALF_WIDTH + 1] = True
    return f, float(spec[near].sum() / ac), band_ratio


def _phase(x: np.ndarray, t_rel: np.ndarray, f: float) -> float:
    """phi of cos(2 pi f t_rel + phi) in a detrended signal (Hann-weighted projection)."""
    w = np.hanning(x.size)
    c = np.sum(w * x * np.exp(-2j * np.pi * f * t_rel))
    return _wrap(float(np.angle(c)))


def _features(x: np.ndarray, fs: float, band: tuple[float, float], f_max: float,
              tdp: float | None, f_phase: float | None, t_rel: np.ndarray
              ) -> tuple[SwingFeatures, float | None]:
    p5, p95 = np.percentile(x, [5, 95])
    amp = float(p95 - p5)
    xd = _detrend(x)
    f, conc, band_ratio = _spectrum_features(xd, fs, band, f_max)
    k = _smoothing_samples(fs)
    ramp = float(np.abs(np.diff(_moving_average(x, k))).max() * fs) if x.size > k else 0.0
    mid = (p5 + p95) / 2
    duty = float(np.mean(x > mid)) if amp > 0 else 0.0
    fp = f_phase if f_phase is not None else f
    phase = _phase(xd, t_rel, fp) if fp is not None else None
    ratio = amp / tdp if tdp and tdp > 0 else None
    return SwingFeatures(float(x.mean()), amp, ratio, f, conc, band_ratio, ramp, duty, phase), f


def analyse_window(
    t: np.ndarray,
    power: np.ndarray,
    tdp_watts: np.ndarray | None = None,
    band_hz: tuple[float, float] = DEFAULT_BAND_HZ,
    *,
    gpus: list[int] | None = None,
    max_observable_hz: float | None = None,
    phase_grid_seconds: float = 10.0,
    thresholds: SwingThresholds | None = None,
) -> NodeSwing:
    """Swing features of a node over one window.

    ``t``: sample times (Unix seconds; may be irregular: the window is resampled
    onto a uniform grid at its median rate).  ``power``: (N, len(t)) watts, NaN
    where a sample is missing.  ``tdp_watts``: (N,) power limits, NaN or None
    where unknown.  ``max_observable_hz``: half the sensor's update rate, or the
    bandwidth left by an averaging sensor, when it is below half the sample rate.
    """
    power = np.atleast_2d(np.asarray(power, dtype=np.float64))
    t = np.asarray(t, dtype=np.float64)
    if t.ndim != 1 or t.size < 4:
        raise ValueError("need at least 4 samples")
    n_gpu = power.shape[0]
    ids = list(gpus) if gpus is not None else list(range(n_gpu))
    if len(ids) != n_gpu:
        raise ValueError("gpus must name every row of power")
    grid, x = resample(t, power)
    dt = float(grid[1] - grid[0])
    fs = 1.0 / dt
    nyq = fs / 2
    band_hi = min(nyq, max_observable_hz) if max_observable_hz else nyq
    ok = np.isfinite(x).all(axis=1)
    tdp = (np.full(n_gpu, np.nan) if tdp_watts is None
           else np.asarray(tdp_watts, dtype=np.float64).reshape(n_gpu))
    node_x = x[ok].sum(axis=0) if ok.any() else np.zeros(grid.size)
    node_tdp = float(tdp.sum()) if np.isfinite(tdp).all() and ok.all() else None
    t_ref = math.floor(grid[-1] / phase_grid_seconds) * phase_grid_seconds
    t_rel = grid - t_ref
    node_f, f = _features(node_x, fs, band_hz, band_hi, node_tdp, None, t_rel)
    per_gpu: dict[int, SwingFeatures] = {}
    for i, g in enumerate(ids):
        if not ok[i]:
            continue
        ti = float(tdp[i]) if np.isfinite(tdp[i]) else None
        per_gpu[g], _ = _features(x[i], fs, band_hz, band_hi, ti, f, t_rel)
    sync = synchrony(x[ok]) if ok.any() else 0.0
    partial = NodeSwing(node_f, per_gpu, sync, (0.0, band_hi), fs, float(grid[-1] - grid[0]),
                        t_ref, False)
    cand = (thresholds or SwingThresholds(band_hz=band_hz)).matches(partial)
    return NodeSwing(node_f, per_gpu, sync, (0.0, band_hi), fs, partial.duration_seconds,
                     t_ref, cand)


# --------------------------------------------------------------------------- cycle scale


def _block_mean(x: np.ndarray, k: int) -> np.ndarray:
    m = x.shape[-1] // k
    return x[..., : m * k].reshape(*x.shape[:-1], m, k).mean(axis=-1)


def analyse_cycles(
    t: np.ndarray,
    power: np.ndarray,
    tdp_watts: np.ndarray | None = None,
    *,
    min_period_seconds: float = 10.0,
    max_period_seconds: float | None = None,
    resolution_seconds: float = 0.5,
    min_strength: float = 0.3,
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
    """
    power = np.atleast_2d(np.asarray(power, dtype=np.float64))
    t = np.asarray(t, dtype=np.float64)
    if t.size < 8:
        return None
    dt_native = sample_interval(t)
    k = max(1, int(round(resolution_seconds / dt_native)))
    grid, x = resample(t, power)
    ok = np.isfinite(x).all(axis=1)
    if not ok.any():
        return None
    x = _block_mean(x[ok], k)
    dt = dt_native * k
    node = x.sum(axis=0)
    n = node.size
    span = n * dt
    max_p = max_period_seconds if max_period_seconds is not None else span / 4
    lag_min = max(2, int(math.ceil(min_period_seconds / dt)))
    lag_max = min(n // 2, int(math.floor(max_p / dt)))
    if lag_max <= lag_min + 1:
        return None
    d = np.diff(node)
    d = d - np.median(d)
    # clip at the k-th largest change, k = the fewest edges a cycle of the longest
    # period leaves in the window: one-off steps then weigh no more than an edge
    k_edges = max(8, 2 * int(span / max_p))
    mag = np.abs(d)
    cap = float(np.partition(mag, mag.size - k_edges)[mag.size - k_edges]) \
        if mag.size > k_edges else float(mag.max())
    if cap <= 0:
        return None
    d = np.clip(d, -cap, cap)
    d = d - d.mean()
    m = d.size
    nfft = 1 << (2 * m - 1).bit_length()
    spec = np.fft.rfft(d, nfft)
    acf = np.fft.irfft(np.abs(spec) ** 2, nfft)[:m]
    if acf[0] <= 0:
        return None
    acf = acf / acf[0] * m / (m - np.arange(m))  # unbiased, normalised
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
    lag = best + _parabolic(float(acf[best - 1]), float(acf[best]), float(acf[best + 1]))
    period = lag * dt
    # fold every GPU at the period: the mean cycle
    nbins = max(4, int(round(period / dt)))
    phase_bin = np.floor((np.arange(n) * dt / period % 1.0) * nbins).astype(int) % nbins
    counts = np.bincount(phase_bin, minlength=nbins).astype(float)
    counts[counts == 0] = np.nan
    prof = np.stack([np.bincount(phase_bin, weights=row, minlength=nbins) for row in x]) / counts
    prof = prof[:, np.isfinite(counts)]
    node_prof = prof.sum(axis=0)
    amp = float(node_prof.max() - node_prof.min())
    mid = (node_prof.max() + node_prof.min()) / 2
    tdp = None if tdp_watts is None else np.asarray(tdp_watts, dtype=np.float64).reshape(-1)
    node_tdp = float(tdp[ok].sum()) if tdp is not None and np.isfinite(tdp[ok]).all() else None
    ramp = float(np.abs(np.diff(node)).max() / dt) if n > 1 else 0.0
    ids = [i for i in range(power.shape[0]) if ok[i]]
    return CycleFeatures(
        period_seconds=float(period),
        frequency_hz=float(1.0 / period),
        strength=min(1.0, strength),
        amplitude_watts=amp,
        amplitude_ratio=amp / node_tdp if node_tdp else None,
        gpu_amplitude_watts={g: float(r.max() - r.min()) for g, r in zip(ids, prof, strict=True)},
        duty_cycle=float(np.mean(node_prof > mid)),
        synchrony=synchrony(prof),
        max_ramp_watts_per_second=ramp,
    )


# --------------------------------------------------------------------------- ramps


def detect_ramps(
    t: np.ndarray,
    node_power: np.ndarray,
    tdp_total: float | None = None,
    *,
    min_ratio: float = 0.30,
    max_duration_seconds: float = 5.0,
    hold_seconds: float = 25.0,
    max_level_drift: float = 0.25,
) -> list[Ramp]:
    """Large synchronised rises and falls of the node's power.

    A ramp is a change of at least ``min_ratio`` of ``tdp_total`` (of the
    observed p99 - p1 range when the TDP is unknown) within
    ``max_duration_seconds``, to a level that holds: the mean power in each
    half of the ``hold_seconds`` before the ramp and in each half of the
    ``hold_seconds`` after it (clear of ``max_duration_seconds`` around the
    change) must all differ by at least the threshold, and
    the two halves on each side may differ by at most ``max_level_drift`` of
    the change.  That keeps out dips and drops that come back within about
    ``hold_seconds`` (step-time swings, checkpoint cycles: see analyse_cycles).
    The time is where the mean level changes most; the duration runs from
    leaving the old level's p5-p95 range to entering the new level's, so a
    ramp out of a swinging level is timed by its envelope.
    """
    t = np.asarray(t, dtype=np.float64)
    node_power = np.asarray(node_power, dtype=np.float64)
    if t.size < 4:
        return []
    grid, xs = resample(t, node_power[None, :])
    x = xs[0]
    if not np.isfinite(x).all():
        return []
    dt = float(grid[1] - grid[0])
    if tdp_total and tdp_total > 0:
        thr = min_ratio * tdp_total
    else:
        lo, hi = np.percentile(x, [1, 99])
        thr = min_ratio * float(hi - lo)
    if thr <= 0:
        return []
    w = max(1, int(round(max_duration_seconds / dt)))
    if x.size <= w:
        return []
    d = x[w:] - x[:-w]
    sign = np.where(d >= thr, 1, np.where(d <= -thr, -1, 0))
    h = max(2, int(round(hold_seconds / 2 / dt)))
    min_side = max(1, h // 3)
    csum = np.concatenate([[0.0], np.cumsum(x)])
    ramps: list[Ramp] = []
    floor = 1  # no split point before the end of the last ramp's hold
    i = 0
    while i < sign.size:
        if sign[i] == 0:
            i += 1
            continue
        j = i
        while j + 1 < sign.size and sign[j + 1] == sign[i]:
            j += 1
        s = int(sign[i])
        a = i + int(np.argmax(s * d[i:j + 1]))  # the change lies within x[a..a+w]
        ramp = _ramp_at(x, csum, grid, a, w, h, min_side, s, thr, max_level_drift, floor)
        if ramp is not None:
            ramps.append(ramp)
            # one change, one ramp: skip the rest of it and the level it holds
            floor = int(np.searchsorted(grid, ramp.time)) + h
            j = max(j, floor)
        i = j + 1
    return ramps


def _ramp_at(x: np.ndarray, csum: np.ndarray, grid: np.ndarray, a: int, w: int, h: int,
             min_side: int, s: int, thr: float, max_drift: float, floor: int
             ) -> Ramp | None:
    """Check and measure the candidate change in x[a..a+w] (see detect_ramps)."""
    n = x.size
    dt = float(grid[1] - grid[0])
    # split point: where the mean of h samples after minus h before is largest
    lo, hi = max(floor, a - h), min(n - 1, a + w + h)
    if hi < lo:
        return None
    c = np.arange(lo, hi + 1)
    nb = np.minimum(c, h)
    na = np.minimum(n - c, h)
    mb = (csum[c] - csum[c - nb]) / nb
    ma = (csum[c + na] - csum[c]) / na
    c0 = int(c[np.argmax(s * (ma - mb))])
    if c0 == hi and hi < n - 1:
        return None  # the change goes on past this candidate: a later one will see it
    # levels, clear of the ramp itself (at most w samples either side of c0)
    before = [x[max(0, c0 - w - 2 * h):max(0, c0 - w - h)], x[max(0, c0 - w - h):max(0, c0 - w)]]
    after = [x[c0 + w:c0 + w + h], x[c0 + w + h:c0 + w + 2 * h]]
    if before[1].size < min_side or after[0].size < min_side:
        return None
    b_means = [float(v.mean()) for v in before if v.size >= min_side]
    a_means = [float(v.mean()) for v in after if v.size >= min_side]
    gap = (min(a_means) - max(b_means)) if s > 0 else (min(b_means) - max(a_means))
    drift = max(np.ptp(b_means), np.ptp(a_means))
    if gap < thr or drift > max_drift * gap:
        return None
    # duration: from leaving the old level's p5-p95 range (widened by 10 % of the
    # change) to entering the new one's
    b_lo, b_hi = np.percentile(before[1], [5, 95])
    a_lo, a_hi = np.percentile(after[0], [5, 95])
    seg = x[max(0, c0 - w):min(n, c0 + w + 1)]
    base = max(0, c0 - w)
    tol = 0.1 * gap  # flat, drifting levels: like a 10-90 % rise time
    in_old = (seg <= b_hi + tol) if s > 0 else (seg >= b_lo - tol)
    in_new = (seg >= a_lo - tol) if s > 0 else (seg <= a_hi + tol)
    k0 = c0 - base
    old_idx = np.flatnonzero(in_old[:k0 + 1])
    new_idx = np.flatnonzero(in_new[k0:]) + k0
    rs = int(old_idx[-1]) if old_idx.size else 0
    r_end = int(new_idx[0]) if new_idx.size else seg.size - 1
    lb, la = float(before[1].mean()), float(after[0].mean())
    return Ramp(
        time=float(grid[base + (rs + r_end) // 2]),
        direction="rise" if s > 0 else "fall",
        delta_watts=la - lb,
        duration_seconds=float(max(dt, (r_end - rs) * dt)),
    )
