"""analyse_window measures all rows (the node and its GPUs) at once: the result must be
what measuring each row on its own gave (the plain per-row code below, as it was
before), to 1e-9 relative: the same operations, only batched, agree bit for bit here,
but which kernels numpy picks for a matrix and for a row depends on the CPU, and a
test must pass on any. Percentiles must equal np.percentile exactly (a sort and
element-wise arithmetic, the same on every CPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from exporter.analysis.power_swing import NodeSwing, SwingFeatures, analyse_window
from exporter.analysis.signal import (
    detrend,
    hann,
    moving_average,
    parabolic,
    percentiles,
    resample,
    smoothing_samples,
    wrap,
)
from exporter.analysis.spectrum import EDGE_RATIO, _fundamental, edge_frequency
from tests.tools import assert_same_numbers

T0 = 1_758_000_000.0


# --------------------------------------------------------------------- the per-row code


def ref_spectrum(x: np.ndarray, fs: float, band: tuple[float, float], f_max: float
                 ) -> tuple[float | None, float, float]:
    n = x.size
    spec = np.abs(np.fft.rfft(x * hann(n))) ** 2
    freqs = np.arange(spec.size) * fs / n
    ac = float(spec[1:].sum())
    if ac <= 0 or not np.isfinite(ac):
        return None, 0.0, 0.0
    in_band = (freqs >= band[0]) & (freqs <= band[1])
    band_ratio = float(spec[in_band].sum() / ac)
    k_max = min(spec.size - 2, int(math.floor(f_max * n / fs)))
    if k_max < 2:
        return None, 0.0, band_ratio
    k = _fundamental(spec, 2, k_max)
    ls = np.log(spec[k - 1:k + 2] + 1e-300)
    k_ref = k + parabolic(float(ls[0]), float(ls[1]), float(ls[2]))
    near = np.zeros(spec.size, dtype=bool)
    for h in range(1, 6):
        c = int(round(k_ref * h))
        if c - 2 >= spec.size:
            break
        near[max(1, c - 2):c + 3] = True
    return k_ref * fs / n, float(spec[near].sum() / ac), band_ratio


def ref_phase(x: np.ndarray, t_rel: np.ndarray, f: float) -> float:
    c = np.sum(hann(x.size) * x * np.exp(-2j * np.pi * f * t_rel))
    return wrap(float(np.angle(c)))


def ref_edges(x: np.ndarray, fs: float) -> float | None:
    p5, p95 = np.percentile(x, [5, 95])
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


def ref_features(x: np.ndarray, fs: float, band: tuple[float, float], band_hi: float,
                 tdp: float | None, f_phase: float | None, t_rel: np.ndarray) -> SwingFeatures:
    p5, p95 = np.percentile(x, [5, 95])
    amp = float(p95 - p5)
    xd = detrend(x)
    f_app, conc, band_ratio = ref_spectrum(xd, fs, band, fs / 2)
    unresolved = f_app is not None and f_app >= EDGE_RATIO * band_hi
    f = None if unresolved else f_app
    k = smoothing_samples(fs)
    ramp = float(np.abs(np.diff(moving_average(x, k))).max() * fs) if x.size > k else 0.0
    duty = float(np.mean(x > (p5 + p95) / 2)) if amp > 0 else 0.0
    fp = f_phase if f_phase is not None else f
    ph = ref_phase(xd, t_rel, fp) if fp is not None else None
    ratio = amp / tdp if tdp and tdp > 0 else None
    return SwingFeatures(float(x.mean()), amp, ratio, f, conc, band_ratio, ramp, duty, ph,
                         f_app, unresolved, ref_edges(x, fs))


def reference_window(t: np.ndarray, power: np.ndarray, tdp: np.ndarray | None,
                     band_hz: tuple[float, float] = (0.1, 3.0),
                     max_observable_hz: float | None = None,
                     phase_grid_seconds: float = 10.0) -> tuple[SwingFeatures, dict]:
    grid, x = resample(t, power)
    fs = 1.0 / float(grid[1] - grid[0])
    band_hi = min(fs / 2, max_observable_hz) if max_observable_hz else fs / 2
    ok = np.isfinite(x).all(axis=1)
    tdp = np.full(x.shape[0], np.nan) if tdp is None else tdp
    node_x = x[ok].sum(axis=0) if ok.any() else np.zeros(grid.size)
    node_tdp = float(tdp.sum()) if np.isfinite(tdp).all() and ok.all() else None
    t_rel = grid - math.floor(grid[-1] / phase_grid_seconds) * phase_grid_seconds
    node = ref_features(node_x, fs, band_hz, band_hi, node_tdp, None, t_rel)
    gpus = {i: ref_features(x[i], fs, band_hz, band_hi,
                            float(tdp[i]) if np.isfinite(tdp[i]) else None,
                            node.frequency_hz, t_rel)
            for i in range(x.shape[0]) if ok[i]}
    return node, gpus


def same(got: SwingFeatures, want: SwingFeatures) -> None:
    assert_same_numbers(got, want)


def check(t: np.ndarray, power: np.ndarray, tdp: np.ndarray | None, **kw) -> NodeSwing:
    got = analyse_window(t, power, tdp, **kw)
    node, gpus = reference_window(t, power, tdp, **kw)
    same(got.node, node)
    assert got.gpus.keys() == gpus.keys()
    for g, feats in gpus.items():
        same(got.gpus[g], feats)
    return got


# --------------------------------------------------------------------------- tests


def node(seed: int, n_gpu: int = 8, seconds: float = 30.0, fs: float = 50.0
         ) -> tuple[np.ndarray, np.ndarray]:
    """Square or sine swings, in step or not, with noise, at a random frequency."""
    rng = np.random.default_rng(seed)
    t = T0 + np.arange(int(seconds * fs) + 1) / fs
    f = rng.uniform(0.05, 8.0)
    phases = rng.uniform(0, 2 * np.pi, n_gpu) * rng.choice([0.0, 0.1, 1.0])
    wave = np.cos(2 * np.pi * f * (t - T0)[None, :] + phases[:, None])
    if seed % 2:
        wave = np.where(wave > rng.uniform(-0.6, 0.6), 1.0, -1.0)
    amp = rng.uniform(0, 300)
    power = 400 + amp * wave + rng.normal(0, rng.choice([1.0, 20.0]), (n_gpu, t.size))
    return t, power


def test_same_features_as_measuring_each_row_alone() -> None:
    unresolved = resolved = 0
    for seed in range(40):
        t, power = node(seed)
        resolved += check(t, power, np.full(8, 700.0)).node.frequency_hz is not None
        # a slower sensor: fast swings are unresolved
        unresolved += check(t, power, None, max_observable_hz=2.0).node.unresolved
    assert resolved > 10 and unresolved > 0


def test_same_features_with_missing_gpus_flat_ones_and_short_windows() -> None:
    t, power = node(3)
    power[2] = np.nan  # a GPU without samples: left out
    power[5] = 250.0  # flat: no frequency, no edges, no duty
    power[6, 100:130] = np.nan  # a gap, bridged by the resampling
    check(t, power, np.full(8, 700.0))
    check(t, np.full((4, t.size), 300.0), None)  # a flat node: no frequency anywhere
    noise = np.random.default_rng(0).normal(300, 5, (4, t.size))
    check(t, noise, None, band_hz=(0.5, 1.0))
    check(t[:9], power[:, :9], np.full(8, 700.0))  # too short to search a frequency
    check(t, power[:1], np.array([700.0]))  # one GPU


def test_percentiles_equal_numpy() -> None:
    rng = np.random.default_rng(0)
    for n in [1, 2, 3, 7, 100, 1501]:
        x = rng.normal(0, 100, (5, n))
        for arr in (x, np.round(x / 50) * 50, x[0]):  # ties, one row
            for q in ([5, 95], [1, 99], [0, 100], [50], [33.3]):
                assert np.array_equal(percentiles(arr, q), np.percentile(arr, q, axis=-1))


def test_edge_frequency_of_one_signal() -> None:
    rng = np.random.default_rng(2)
    for seed in range(10):
        _, power = node(seed, n_gpu=1)
        x = power[0] + rng.normal(0, 1, power.shape[1])
        assert_same_numbers(edge_frequency(x, 50.0), ref_edges(x, 50.0))


def test_numbers_must_agree_to_1e9_and_the_rest_exactly() -> None:
    """The comparison above lets the last digits go, nothing else."""
    base = SwingFeatures(400.0, 500.0, None, 0.5, 0.9, 0.95, 3000.0, 0.5, 1.0)
    assert_same_numbers(base, SwingFeatures(400.0 * (1 + 1e-13), 500.0, None, 0.5, 0.9,
                                            0.95, 3000.0, 0.5, 1.0))
    assert_same_numbers({"a": [np.array([1.0, np.nan])]}, {"a": [np.array([1.0, np.nan])]})
    for other in (SwingFeatures(400.0 * (1 + 1e-7), 500.0, None, 0.5, 0.9, 0.95, 3000.0,
                                0.5, 1.0),
                  SwingFeatures(400.0, 500.0, 0.7, 0.5, 0.9, 0.95, 3000.0, 0.5, 1.0),
                  SwingFeatures(400.0, 500.0, None, None, 0.9, 0.95, 3000.0, 0.5, 1.0),
                  SwingFeatures(400.0, 500.0, None, 0.5, 0.9, 0.95, 3000.0, 0.5, 1.0,
                                unresolved=True)):
        with pytest.raises(AssertionError):
            assert_same_numbers(other, base)
    with pytest.raises(AssertionError):
        assert_same_numbers({"a": np.array([1.0, 2.0])}, {"a": np.array([1.0, 2.001])})
    with pytest.raises(AssertionError):
        assert_same_numbers([1.0, 2.0], [1.0])
