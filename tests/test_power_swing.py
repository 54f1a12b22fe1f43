"""Power-swing analysis on synthetic signals with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from exporter.analysis.power_swing import (
    SwingDetector,
    analyse_cycles,
    analyse_window,
    detect_dips,
    detect_ramps,
    resample,
    synchrony,
)
from exporter.analysis.spectrum import edge_frequency, frequency_consistent
from exporter.sampling.settings import PowerSettings

T0 = 1_758_000_000.0  # a 2025 Unix time: phase must survive 1.7e9-second stamps
FS = 20.0
TDP = np.full(8, 700.0)
TH = PowerSettings().swing_thresholds()  # the live analysis' thresholds, as run holds them


def grid(seconds: float = 30.0, fs: float = FS, start: float = T0) -> np.ndarray:
    return start + np.arange(int(seconds * fs)) / fs


def square(t: np.ndarray, f: float, phase: float = 0.0, duty: float = 0.5) -> np.ndarray:
    """1 during the first `duty` of each period of cos-phase, else 0."""
    frac = (f * (t - T0) + phase / (2 * math.pi)) % 1.0
    return (frac < duty).astype(float)


def node_square(t: np.ndarray, f: float, n: int = 8, low: float = 150.0, high: float = 650.0,
                phases: np.ndarray | None = None, noise: float = 10.0, seed: int = 0,
                duty: float = 0.5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ph = np.zeros(n) if phases is None else phases
    return np.stack([low + (high - low) * square(t, f, ph[i], duty) + rng.normal(0, noise, t.size)
                     for i in range(n)])


@pytest.mark.parametrize("f", [0.15, 0.5, 1.0, 2.5, 4.0])
def test_frequency_within_5_percent(f: float) -> None:
    t = grid()
    ns = analyse_window(t, node_square(t, f), TDP, thresholds=TH)
    assert ns.node.frequency_hz == pytest.approx(f, rel=0.05)
    for g in ns.gpus.values():
        assert g.frequency_hz == pytest.approx(f, rel=0.05)


@pytest.mark.parametrize("f", [0.23, 0.71, 1.37])
def test_sine_frequency_between_bins(f: float) -> None:
    t = grid()
    p = 400 + 200 * np.sin(2 * np.pi * f * (t - T0))[None, :] + np.zeros((2, 1))
    ns = analyse_window(t, p, None, thresholds=TH)
    assert ns.node.frequency_hz == pytest.approx(f, rel=0.02)


def test_amplitude_within_10_percent_and_ratio_of_tdp() -> None:
    t = grid()
    ns = analyse_window(t, node_square(t, 0.5), TDP, thresholds=TH)
    assert ns.node.amplitude_watts == pytest.approx(8 * 500, rel=0.10)
    assert ns.node.amplitude_ratio == pytest.approx(8 * 500 / 5600, rel=0.10)
    for g in ns.gpus.values():
        assert g.amplitude_watts == pytest.approx(500, rel=0.10)
        assert g.amplitude_ratio == pytest.approx(500 / 700, rel=0.10)
    assert analyse_window(t, node_square(t, 0.5), None).node.amplitude_ratio is None


def test_short_pulses_report_the_fundamental_not_a_harmonic() -> None:
    t = grid()
    ns = analyse_window(t, node_square(t, 0.4, 4, duty=0.12), TDP[:4], thresholds=TH)
    assert ns.node.frequency_hz == pytest.approx(0.4, rel=0.05)


def test_synchrony_in_phase_vs_independent() -> None:
    t = grid()
    in_phase = analyse_window(t, node_square(t, 0.5), TDP)
    assert in_phase.synchrony > 0.9
    rng = np.random.default_rng(3)
    phases = rng.uniform(0, 2 * math.pi, 8)
    indep = analyse_window(t, node_square(t, 0.5, phases=phases), TDP)
    assert indep.synchrony < 0.35
    noise = analyse_window(t, 400 + rng.normal(0, 20, (8, t.size)), TDP, thresholds=TH)
    assert noise.synchrony == pytest.approx(1 / 8, abs=0.08)


def orthogonal_rows(n: int, m: int, seed: int = 7) -> np.ndarray:
    """n rows of m samples with unit variance, no mean, no linear trend, and no
    correlation with each other: detrending leaves them as they are, and the variance
    of their sum is the sum of their variances (independent GPUs, exactly)."""
    u = np.arange(m) - (m - 1) / 2
    trend, _ = np.linalg.qr(np.stack([np.ones(m), u], axis=1))
    a = np.random.default_rng(seed).normal(size=(m, n))
    a -= trend @ (trend.T @ a)
    q, _ = np.linalg.qr(a)
    return q.T * math.sqrt(m)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_synchrony_of_independent_gpus_is_one_over_n(n: int) -> None:
    """var(sum) = sum of var for uncorrelated rows, so the figure is exactly 1/N
    (a formula dividing by N - 1 instead gives 1/(N - 1): 1.0 for two GPUs)."""
    rows = orthogonal_rows(n, 600)
    assert synchrony(rows) == pytest.approx(1 / n, rel=1e-6)
    assert synchrony(400 + 50 * rows) == pytest.approx(1 / n, rel=1e-6)
    # what analyse_window reports is the same figure (after it puts the samples on its
    # own grid, which moves them by rounding of 1.7e9 s stamps: hence the looser bound)
    t = grid(30.0)
    assert analyse_window(t, 400 + 50 * rows, None).synchrony == pytest.approx(1 / n, rel=1e-3)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_a_shared_ramp_does_not_make_independent_swings_synchronous(n: int) -> None:
    """Every GPU warms up along the same line (a load ramping up, a fan curve) while each
    swings on its own: the line is not a swing, so the figure stays at 1/N. Without the
    detrending the common ramp, far larger than the swings, would read as near 1."""
    rows = orthogonal_rows(n, 600)
    ramp = np.linspace(0.0, 120.0, 600)  # 120 W over the window; the swings' rms is 10 W
    power = 400 + 10 * rows + ramp
    assert synchrony(power) == pytest.approx(1 / n, rel=1e-6)
    # each GPU on its own line (slopes and levels of its own) changes nothing either
    slopes = np.linspace(0.5, 2.0, n)[:, None]
    assert synchrony(power + slopes * ramp) == pytest.approx(1 / n, rel=1e-6)
    t = grid(30.0)
    assert analyse_window(t, power, None).synchrony == pytest.approx(1 / n, rel=1e-3)


def test_synchrony_of_known_mixtures() -> None:
    t = grid()
    x = np.sin(2 * np.pi * 0.5 * (t - T0))
    # in phase, unequal amplitudes 1, 2, 3: (1+2+3)^2 / (3 * (1+4+9)) = 36/42
    assert synchrony(np.stack([x, 2 * x, 3 * x])) == pytest.approx(6 / 7, rel=1e-6)
    # one GPU swings, one is flat: var(x) / (2 * var(x))
    assert synchrony(np.stack([x, np.zeros_like(x)])) == pytest.approx(0.5, rel=1e-6)
    # two in phase, two independent of them and of each other:
    # var(2a + b + c) / (4 * 4) = (4 + 1 + 1) / 16
    a, b, c = orthogonal_rows(3, t.size)
    assert synchrony(np.stack([a, a, b, c])) == pytest.approx(6 / 16, rel=1e-6)


def test_synchrony_bounds() -> None:
    t = grid()
    x = np.sin(2 * np.pi * 0.5 * (t - T0))
    assert synchrony(np.stack([x, x])) == pytest.approx(1.0)
    assert synchrony(np.stack([x, -x])) == pytest.approx(0.0, abs=1e-9)
    assert synchrony(np.stack([x])) == pytest.approx(1.0)
    assert synchrony(np.full((3, t.size), 300.0)) == 0.0


def test_phase_matches_time_shift_between_nodes() -> None:
    """Two nodes see the same oscillation, node B delayed by 0.3 s."""
    f, shift = 0.5, 0.3
    t = grid(start=T0 + 1234.56)  # both nodes sample the same wall-clock window
    a = 400 + 200 * np.cos(2 * np.pi * f * t % (2 * np.pi) + 0.4)
    b = 400 + 200 * np.cos(2 * np.pi * f * (t - shift) % (2 * np.pi) + 0.4)
    na = analyse_window(t, np.stack([a, a]), None)
    nb = analyse_window(t, np.stack([b, b]), None)
    assert na.phase_reference_time == nb.phase_reference_time
    diff = math.remainder(nb.node.phase_radians - na.node.phase_radians, 2 * math.pi)
    assert diff == pytest.approx(-2 * math.pi * f * shift, abs=0.1)
    # and the phase is the phi of cos(2 pi f (t - t_ref) + phi)
    expect = math.remainder(2 * math.pi * f * na.phase_reference_time + 0.4, 2 * math.pi)
    assert math.remainder(na.node.phase_radians - expect, 2 * math.pi) == pytest.approx(
        0, abs=0.1)
    # each GPU's phase is taken at the node's frequency, so it matches the node's
    assert na.gpus[0].phase_radians == pytest.approx(na.node.phase_radians, abs=1e-6)


def test_phase_is_independent_of_sampling_grid_offset() -> None:
    """Nodes sampling at different instants still agree on the phase."""
    f = 0.8
    ta = grid(start=T0 + 500.0)
    tb = grid(start=T0 + 500.0 + 0.021)
    sig = lambda t: 300 + 100 * np.cos(2 * np.pi * f * (t - T0) + 1.0)  # noqa: E731
    pa = analyse_window(ta, sig(ta)[None, :], None).node.phase_radians
    pb = analyse_window(tb, sig(tb)[None, :], None).node.phase_radians
    assert math.remainder(pa - pb, 2 * math.pi) == pytest.approx(0, abs=0.05)


def test_no_swing_on_flat_or_noise() -> None:
    t = grid()
    flat = analyse_window(t, np.full((8, t.size), 450.0), TDP, thresholds=TH)
    assert flat.node.amplitude_watts == 0.0
    assert flat.node.frequency_hz is None
    assert not flat.candidate
    rng = np.random.default_rng(1)
    noise = analyse_window(t, 450 + rng.normal(0, 15, (8, t.size)), TDP, thresholds=TH)
    assert not noise.candidate
    assert noise.node.peak_concentration < 0.3
    det = SwingDetector(TH, hold=3)
    assert not any(det.update(noise) for _ in range(5))


def test_detector_needs_hold_consecutive_windows() -> None:
    t = grid()
    swing = analyse_window(t, node_square(t, 0.5), TDP, thresholds=TH)
    calm = analyse_window(t, 400 + np.random.default_rng(0).normal(0, 5, (8, t.size)), TDP)
    assert swing.candidate
    det = SwingDetector(TH, hold=3)
    assert [det.update(swing) for _ in range(3)] == [False, False, True]
    assert not det.update(calm)
    assert not det.update(swing)


def test_thresholds_reject_out_of_band_and_out_of_phase() -> None:
    t = grid()
    fast = analyse_window(t, node_square(t, 4.0), TDP, thresholds=TH)
    assert fast.node.frequency_hz == pytest.approx(4.0, rel=0.05)
    assert not fast.candidate  # outside 0.1-3 Hz
    ph = np.array([0, math.pi] * 4)
    opposed = analyse_window(t, node_square(t, 0.5, phases=ph), TDP, thresholds=TH)
    assert opposed.synchrony < 0.1
    assert not opposed.candidate
    small = analyse_window(t, node_square(t, 0.5, low=400, high=450), TDP, thresholds=TH)
    assert not small.candidate  # 50 W of 700 W per GPU


def test_band_energy_ratio() -> None:
    t = grid()
    inside = analyse_window(t, 400 + 100 * np.sin(2 * np.pi * 0.5 * (t - T0))[None, :], None)
    outside = analyse_window(t, 400 + 100 * np.sin(2 * np.pi * 6.0 * (t - T0))[None, :], None)
    assert inside.node.band_energy_ratio > 0.95
    assert outside.node.band_energy_ratio < 0.05


def test_duty_cycle() -> None:
    t = grid()
    for duty in (0.25, 0.5, 0.75):
        ns = analyse_window(t, node_square(t, 0.5, 2, duty=duty, noise=0), None, thresholds=TH)
        assert ns.node.duty_cycle == pytest.approx(duty, abs=0.05)


def test_max_ramp_rate() -> None:
    t = grid()
    # a trapezoid: 0 -> 1000 W over 1 s: 1000 W/s
    x = np.clip((t - T0 - 10.0) * 1000.0, 0, 1000)[None, :]
    ns = analyse_window(t, x, None, thresholds=TH)
    assert ns.node.max_ramp_watts_per_second == pytest.approx(1000, rel=0.05)


def test_irregular_timestamps() -> None:
    rng = np.random.default_rng(5)
    t = T0 + np.cumsum(rng.uniform(0.03, 0.07, 600))
    p = node_square(t, 0.7, 4)
    ns = analyse_window(t, p, TDP[:4], thresholds=TH)
    assert ns.node.frequency_hz == pytest.approx(0.7, rel=0.05)
    assert ns.sample_rate_hz == pytest.approx(20, rel=0.1)
    assert ns.observable_band_hz == (0.0, pytest.approx(ns.sample_rate_hz / 2))
    assert ns.synchrony > 0.9


def test_missing_samples_are_interpolated() -> None:
    t = grid()
    p = node_square(t, 0.5, 2)
    p[1, 100:110] = np.nan
    ns = analyse_window(t, p, TDP[:2], thresholds=TH)
    assert set(ns.gpus) == {0, 1}
    assert ns.node.frequency_hz == pytest.approx(0.5, rel=0.05)


def test_single_gpu() -> None:
    t = grid()
    ns = analyse_window(t, node_square(t, 1.2, 1), np.array([700.0]), gpus=[5], thresholds=TH)
    assert list(ns.gpus) == [5]
    assert ns.synchrony == 1.0
    assert ns.node.frequency_hz == pytest.approx(1.2, rel=0.05)
    assert ns.candidate


def test_observable_band_limited_by_sensor() -> None:
    t = grid()
    ns = analyse_window(t, node_square(t, 0.3, 2), None, max_observable_hz=0.5, thresholds=TH)
    assert ns.observable_band_hz == (0.0, 0.5)
    assert ns.node.frequency_hz == pytest.approx(0.3, rel=0.05)


@pytest.mark.parametrize("f", [0.625, 2.0, 6.0])
def test_swing_above_the_band_is_unresolved_not_slower(f: float) -> None:
    # the band cut at 0.5 Hz (a 1 s average, as analyze once assumed for any
    # power.draw): the swing's own peak is found, and named unresolved; no
    # lesser peak below 0.5 Hz stands in for it
    t = grid()
    ns = analyse_window(t, node_square(t, f), TDP, max_observable_hz=0.5, thresholds=TH)
    assert ns.node.frequency_hz is None and ns.node.unresolved
    assert ns.node.apparent_frequency_hz == pytest.approx(f, rel=0.05)
    assert not ns.candidate
    assert all(g.frequency_hz is None and g.phase_radians is None for g in ns.gpus.values())
    ok = analyse_window(t, node_square(t, f), TDP)  # at 20 Hz with no cap: resolved
    assert ok.node.frequency_hz == pytest.approx(f, rel=0.05) and not ok.node.unresolved


def test_edge_frequency_and_consistency() -> None:
    t = grid(60)
    x = node_square(t, 0.625).sum(axis=0)
    assert edge_frequency(x, FS) == pytest.approx(0.625, rel=0.05)
    half = np.where(t - T0 < 30, x.mean(), x)  # swinging for half the window: same rate
    assert edge_frequency(half, FS) == pytest.approx(0.625, rel=0.05)
    assert edge_frequency(np.full(t.size, 400.0), FS) is None
    assert frequency_consistent(0.625, 0.625)
    assert frequency_consistent(0.3125, 0.625)  # two rises per period (a two-phase step)
    assert not frequency_consistent(0.11, 0.625)  # 5.7 rises per period: not its period
    assert not frequency_consistent(1.25, 0.625)  # half a rise per period
    assert frequency_consistent(0.5, None)


def test_resample_uniform_grid() -> None:
    t = T0 + np.array([0.0, 0.1, 0.25, 0.3, 0.4])
    g, x = resample(t, np.array([[0.0, 1.0, 2.5, 3.0, 4.0]]))
    assert np.allclose(np.diff(g), 0.1)
    assert np.allclose(x[0], (g - T0) * 10)


# --------------------------------------------------------------------------- slow scale


def checkpoint_node(seconds: float = 600.0, period: float = 60.0, drop: float = 20.0,
                    seed: int = 2) -> tuple[np.ndarray, np.ndarray]:
    t = grid(seconds)
    rng = np.random.default_rng(seed)
    low = ((t - T0 + 30) % period) < drop
    return t, np.stack([650 - 400 * low + rng.normal(0, 15, t.size) for _ in range(8)])


def test_cycle_found_60s_period_20s_drops() -> None:
    t, p = checkpoint_node()
    c = analyse_cycles(t, p, TDP)
    assert c is not None
    assert c.period_seconds == pytest.approx(60, rel=0.03)
    assert c.amplitude_watts == pytest.approx(8 * 400, rel=0.10)
    assert c.amplitude_ratio == pytest.approx(8 * 400 / 5600, rel=0.10)
    assert c.duty_cycle == pytest.approx(2 / 3, abs=0.05)
    assert c.synchrony > 0.9
    assert all(a == pytest.approx(400, rel=0.1) for a in c.gpu_amplitude_watts.values())


def test_cycle_survives_a_job_level_step() -> None:
    t, p = checkpoint_node()
    p[:, t > T0 + 300] += 200  # the job changes phase: everyone draws 200 W more
    c = analyse_cycles(t, p, TDP)
    assert c is not None and c.period_seconds == pytest.approx(60, rel=0.03)


def test_no_cycle_in_noise_or_single_step() -> None:
    t = grid(600)
    rng = np.random.default_rng(9)
    assert analyse_cycles(t, 400 + rng.normal(0, 20, (8, t.size)), TDP) is None
    step = 100 + 500 * (t > T0 + 250) + rng.normal(0, 5, (8, t.size))
    assert analyse_cycles(t, step, TDP) is None


# --------------------------------------------------------------------------- ramps


def test_ramps_job_start_and_crash() -> None:
    t = grid(400, fs=10)
    rng = np.random.default_rng(4)
    level = np.where((t > T0 + 100) & (t < T0 + 300), 5000.0, 600.0)
    level = np.convolve(level, np.ones(20) / 20, mode="same")  # 2 s ramps
    x = level + rng.normal(0, 40, t.size)
    ramps = detect_ramps(t, x, 5600.0)
    assert [r.direction for r in ramps] == ["rise", "fall"]
    assert ramps[0].time - T0 == pytest.approx(100, abs=1.5)
    assert ramps[1].time - T0 == pytest.approx(300, abs=1.5)
    assert ramps[0].delta_watts == pytest.approx(4400, rel=0.05)
    assert ramps[1].delta_watts == pytest.approx(-4400, rel=0.05)
    assert ramps[0].duration_seconds == pytest.approx(1.6, abs=0.4)  # 10-90 % of 2 s


def test_ramps_threshold_and_unknown_tdp() -> None:
    t = grid(200, fs=10)
    x = np.where(t > T0 + 100, 1500.0, 600.0)  # +900 W: 16 % of a 5600 W node
    assert detect_ramps(t, x, 5600.0) == []
    assert [r.direction for r in detect_ramps(t, x, None)] == ["rise"]  # of observed range


def test_no_ramps_from_swings_or_checkpoint_cycles() -> None:
    t = grid(300)
    p = node_square(t, 0.5)
    assert detect_ramps(t, p.sum(axis=0), 5600.0) == []
    t, p = checkpoint_node()
    inner = [r for r in detect_ramps(t, p.sum(axis=0), 5600.0) if 40 < r.time - T0 < 560]
    assert inner == []


# --------------------------------------------------------------------------- dips


def test_pauses_are_dips_with_both_edges_and_swing_lows_are_not() -> None:
    t = grid(240)
    p = node_square(t, 0.625)
    pause = ((t - T0 >= 60) & (t - T0 < 76)) | ((t - T0 >= 150) & (t - T0 < 166))
    p[:, pause] = 160.0
    node = p.sum(axis=0)
    dips = detect_dips(t, node, fill_seconds=1.6)
    assert [round(d.start - T0) for d in dips] == [60, 150]
    for d in dips:
        assert d.duration_seconds == pytest.approx(16, abs=1.0)
        assert d.depth_ratio == pytest.approx(1 - 160 / 400, abs=0.05)
        assert (d.fall.direction, d.rise.direction) == ("fall", "rise")
        assert d.fall.delta_watts < 0 < d.rise.delta_watts
        assert d.fall.duration_seconds < 0.2  # sharp edges at 20 Hz
    # the swing alone, however deep its low phases, has no dip
    assert detect_dips(t, node_square(t, 0.625).sum(axis=0), fill_seconds=1.6) == []


def test_no_dip_without_a_return_or_when_too_long() -> None:
    t = grid(300, fs=10)
    end = np.where(t - T0 < 200, 4000.0, 700.0)  # a job ends: a ramp, not a dip
    assert detect_dips(t, end) == []
    gap = np.where((t - T0 > 50) & (t - T0 < 250), 700.0, 4000.0)  # 200 s between jobs
    assert detect_dips(t, gap, max_seconds=100) == []
    assert len(detect_dips(t, gap)) == 1
    sag = np.where((t - T0 > 100) & (t - T0 < 120), 3000.0, 4000.0)  # -25 %
    assert detect_dips(t, sag) == [] and len(detect_dips(t, sag, min_ratio=0.2)) == 1
