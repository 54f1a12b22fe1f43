"""Power swings: features of a node's GPU power over a window, as pure numpy.

Three scales (see docs/power.md):

- **step scale**, the window swing (:func:`analyse_window`, here; ~30 s at ~20 Hz):
  step-synchronised swings at 0.1-3 Hz: amplitude, dominant frequency, band energy, ramp rate,
  duty cycle, synchrony of the node's GPUs, and the phase against wall-clock
  time; :class:`SwingDetector` turns consecutive windows into a held decision.
- **cycle** (:func:`analyse_cycles`, analysis.cycles; ~10 min): periodic
  patterns too slow for the swing window (checkpoints, evaluation, stalls).
- **ramps and dips** (:func:`detect_ramps`, :func:`detect_dips`,
  analysis.ramps): large synchronised rises and falls of the node's power (job
  start, stop, crash) and pauses (there and back).

The names of all three are importable from here.  Nothing here knows about
NVML, HTTP or Prometheus.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from exporter.analysis.cycles import CycleFeatures, analyse_cycles
from exporter.analysis.ramps import Dip, Ramp, detect_dips, detect_ramps
from exporter.analysis.signal import (
    amplitude_share,
    detrend_rows,
    moving_average,
    percentiles,
    resample,
    sample_interval,
    smoothing_samples,
    synchrony,
)
from exporter.analysis.spectrum import (
    EDGE_RATIO,
    edge_frequencies,
    phase,
    phases,
    spectra_features,
)

__all__ = [
    "DEFAULT_BAND_HZ", "CycleFeatures", "Dip", "NodeSwing", "Ramp", "SwingDetector",
    "SwingFeatures", "SwingThresholds", "analyse_cycles", "analyse_window", "detect_dips",
    "detect_ramps", "resample", "sample_interval", "synchrony",
]

DEFAULT_BAND_HZ: tuple[float, float] = (0.1, 3.0)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class SwingFeatures:
    """Features of one power signal (a GPU, or the node's sum) over a window."""

    mean_watts: float
    amplitude_watts: float  # p95 - p5
    amplitude_ratio: float | None  # amplitude / power limit; None when the limit is unknown
    frequency_hz: float | None  # dominant oscillation; None when flat or unresolved
    peak_concentration: float  # share of AC energy at the dominant frequency and harmonics
    band_energy_ratio: float  # share of AC energy inside the band
    max_ramp_watts_per_second: float  # max |dP/dt| after ~150 ms smoothing
    duty_cycle: float  # share of time above (p5 + p95) / 2
    phase_radians: float | None  # phase of the node's dominant component, see NodeSwing
    # the strongest periodicity up to half the sample rate, even beyond the observable band
    apparent_frequency_hz: float | None = None
    # True when that periodicity lies at or above 90 % of the observable band's top:
    # faster than the sensor can show, so frequency_hz is None rather than a lesser peak
    unresolved: bool = False
    edge_frequency_hz: float | None = None  # rising edges per second (spectrum.edge_frequency)


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
    candidate: bool  # this window alone meets the thresholds it was analysed with (none: False)


@dataclass(frozen=True)
class SwingThresholds:
    """When a window counts as a power swing: built from the power analysis' settings
    (`PowerSettings.swing_thresholds()`, where the defaults are, after docs/power.md)."""

    min_amplitude_ratio: float  # of the node's summed TDP (of its peak if TDP unknown)
    band_hz: tuple[float, float]
    min_band_energy_ratio: float
    min_synchrony: float

    def matches(self, ns: NodeSwing) -> bool:
        n = ns.node
        if n.frequency_hz is None:
            return False
        ratio = amplitude_share(n.amplitude_watts, n.mean_watts, n.amplitude_ratio)
        lo, hi = self.band_hz
        return (
            ratio >= self.min_amplitude_ratio
            and lo <= n.frequency_hz <= hi
            and n.band_energy_ratio > self.min_band_energy_ratio
            and ns.synchrony >= self.min_synchrony
        )


class SwingDetector:
    """A swing is reported once ``hold`` consecutive windows match the thresholds."""

    def __init__(self, thresholds: SwingThresholds, hold: int) -> None:
        if hold < 1:
            raise ValueError("hold must be at least 1")
        self.thresholds = thresholds
        self.hold = hold
        self.streak = 0

    def update(self, ns: NodeSwing) -> bool:
        self.streak = self.streak + 1 if self.thresholds.matches(ns) else 0
        return self.streak >= self.hold

    def reset(self) -> None:
        self.streak = 0


# --------------------------------------------------------------------------- step scale


def _features(x: np.ndarray, fs: float, band: tuple[float, float], band_hi: float,
              tdps: list[float | None], t_rel: np.ndarray) -> list[SwingFeatures]:
    """Features of each row of ``x`` (M, N), computed for all rows at once (the
    per-call cost of numpy, not the samples, dominates at these sizes).

    Row 0 is the node: its frequency times every row's phase (a row's own
    frequency when the node has none).
    """
    p5, p95 = percentiles(x, [5, 95])
    amp = p95 - p5
    xd = detrend_rows(x)
    # search up to the sampling's Nyquist frequency, then judge against the band
    spectral = spectra_features(xd, fs, band, fs / 2)
    f_app = [sp[0] for sp in spectral]
    unresolved = [fa is not None and fa >= EDGE_RATIO * band_hi for fa in f_app]
    f = [None if u else fa for fa, u in zip(f_app, unresolved, strict=True)]
    k = smoothing_samples(fs)
    ramp = (np.abs(np.diff(moving_average(x, k), axis=1)).max(axis=1) * fs
            if x.shape[1] > k else np.zeros(x.shape[0]))
    duty = np.where(amp > 0, np.mean(x > ((p5 + p95) / 2)[:, None], axis=1), 0.0)
    if f[0] is not None:
        ph: list[float | None] = list(phases(xd, t_rel, f[0]))
    else:
        ph = [None if fr is None else phase(row, t_rel, fr) for row, fr in zip(xd, f, strict=True)]
    edges = edge_frequencies(x, fs, p5, p95)
    means, amps = x.mean(axis=1).tolist(), amp.tolist()
    out = []
    for i, tdp in enumerate(tdps):
        ratio = amps[i] / tdp if tdp and tdp > 0 else None
        _, conc, band_ratio = spectral[i]
        out.append(SwingFeatures(means[i], amps[i], ratio, f[i], conc, band_ratio,
                                 float(ramp[i]), float(duty[i]), ph[i], f_app[i], unresolved[i],
                                 edges[i]))
    return out


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
    The dominant frequency is searched up to half the sample rate; one at or
    above 90 % of the observable band's top is reported as ``unresolved`` (with
    ``frequency_hz`` None and the peak in ``apparent_frequency_hz``).
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
    rows = [i for i in range(n_gpu) if ok[i]]
    tdps = [node_tdp] + [float(tdp[i]) if np.isfinite(tdp[i]) else None for i in rows]
    feats = _features(np.vstack([node_x[None, :], x[ok]]), fs, band_hz, band_hi, tdps, t_rel)
    node_f = feats[0]
    per_gpu = {ids[i]: feat for i, feat in zip(rows, feats[1:], strict=True)}
    sync = synchrony(x[ok]) if ok.any() else 0.0
    partial = NodeSwing(node_f, per_gpu, sync, (0.0, band_hi), fs, float(grid[-1] - grid[0]),
                        t_ref, False)
    cand = thresholds is not None and thresholds.matches(partial)
    return NodeSwing(node_f, per_gpu, sync, (0.0, band_hi), fs, partial.duration_seconds,
                     t_ref, cand)


