"""Power swings: features of a node's GPU power over a window, as pure numpy.

Three scales (see docs/power.md):

- **step** (:func:`analyse_window`, here; ~30 s at ~20 Hz): step-synchronised
  swings at 0.1-3 Hz: amplitude, dominant frequency, band energy, ramp rate,
  duty cycle, synchrony of the node's GPUs, and the phase against wall-clock
  time; :class:`SwingDetector` turns consecutive windows into a held decision.
- **cycle** (:func:`analyse_cycles`, analysis.cycles; ~10 min): periodic
  patterns too slow for the step window (checkpoints, evaluation, stalls).
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
    detrend,
    moving_average,
    resample,
    sample_interval,
    smoothing_samples,
    synchrony,
)
from exporter.analysis.spectrum import EDGE_RATIO, edge_frequency, phase, spectrum_features

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


# --------------------------------------------------------------------------- step scale


def _features(x: np.ndarray, fs: float, band: tuple[float, float], band_hi: float,
              tdp: float | None, f_phase: float | None, t_rel: np.ndarray
              ) -> SwingFeatures:
    """Features of one signal; ``f_phase``: the node's frequency (GPUs' phases use it)."""
    p5, p95 = np.percentile(x, [5, 95])
    amp = float(p95 - p5)
    xd = detrend(x)
    # search up to the sampling's Nyquist frequency, then judge against the band
    f_app, conc, band_ratio = spectrum_features(xd, fs, band, fs / 2)
    unresolved = f_app is not None and f_app >= EDGE_RATIO * band_hi
    f = None if unresolved else f_app
    k = smoothing_samples(fs)
    ramp = float(np.abs(np.diff(moving_average(x, k))).max() * fs) if x.size > k else 0.0
    mid = (p5 + p95) / 2
    duty = float(np.mean(x > mid)) if amp > 0 else 0.0
    fp = f_phase if f_phase is not None else f
    ph = phase(xd, t_rel, fp) if fp is not None else None
    ratio = amp / tdp if tdp and tdp > 0 else None
    return SwingFeatures(float(x.mean()), amp, ratio, f, conc, band_ratio, ramp, duty, ph,
                         f_app, unresolved, edge_frequency(x, fs, (float(p5), float(p95))))


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
    node_f = _features(node_x, fs, band_hz, band_hi, node_tdp, None, t_rel)
    per_gpu: dict[int, SwingFeatures] = {}
    for i, g in enumerate(ids):
        if not ok[i]:
            continue
        ti = float(tdp[i]) if np.isfinite(tdp[i]) else None
        per_gpu[g] = _features(x[i], fs, band_hz, band_hi, ti, node_f.frequency_hz, t_rel)
    sync = synchrony(x[ok]) if ok.any() else 0.0
    partial = NodeSwing(node_f, per_gpu, sync, (0.0, band_hi), fs, float(grid[-1] - grid[0]),
                        t_ref, False)
    cand = (thresholds or SwingThresholds(band_hz=band_hz)).matches(partial)
    return NodeSwing(node_f, per_gpu, sync, (0.0, band_hi), fs, partial.duration_seconds,
                     t_ref, cand)


