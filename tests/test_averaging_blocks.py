"""The averaging evidence on a long trace: its grid of every GPU's power is made a block
of columns at a time, the node's sum one row at a time; the evidence is that of the
whole grid, bit for bit, and the whole grid is never held."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from exporter.analysis.averaging import (
    InterpolatedRows,
    averaging_evidence,
    high_frequency_rms,
    noise_floor_ratio,
)

T0 = 1_758_000_000.0


def _series(m: int, gpus: int = 8) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each GPU's power read every ~0.1 s (its own jitter): a 2.5 s swing and noise."""
    rng = np.random.default_rng(5)
    out = []
    for g in range(gpus):
        t = T0 + np.cumsum(rng.uniform(0.09, 0.11, m)) + 0.01 * g
        x = np.where(((t - T0) % 2.5) < 1.7, 640.0, 260.0) + rng.normal(0.0, 12.0, m)
        out.append((t, x))
    return out


def _times(series: list[tuple[np.ndarray, np.ndarray]], dt: float = 0.1) -> np.ndarray:
    t0 = max(float(t[0]) for t, _ in series)
    t1 = min(float(t[-1]) for t, _ in series)
    return t0 + np.arange(int((t1 - t0) / dt) + 1) * dt


@pytest.mark.parametrize("block", [1, 100, 777, 1 << 16])
def test_blocks_and_the_row_sum_are_the_whole_grids(block: int) -> None:
    series = _series(3000)
    times = _times(series)
    whole = np.stack([np.interp(times, t, x) for t, x in series])
    rows = InterpolatedRows(times, series, block=block)
    assert rows.shape == whole.shape
    assert rows.row_sum().tobytes() == whole.sum(axis=0).tobytes()
    for a in range(0, times.size - 200, 100):  # noise_floor_ratio's half-overlapping reads
        assert rows[:, a:a + 200].tobytes() == whole[:, a:a + 200].tobytes()
    assert rows[:, 5:3].shape == (8, 0)
    assert noise_floor_ratio(rows, 10.0, 1.0) == noise_floor_ratio(whole, 10.0, 1.0)
    with pytest.raises(IndexError):
        rows[:, 0:10:2]


def test_one_gpus_sum_is_its_row() -> None:
    series = _series(500, gpus=1)
    times = _times(series)
    assert InterpolatedRows(times, series).row_sum().tobytes() == \
        np.interp(times, *series[0]).tobytes()


def whole_evidence_stats(series: list[tuple[np.ndarray, np.ndarray]]) -> tuple:
    """The grid-based figures of averaging_evidence, from the whole grid as it was made."""
    dt = float(np.median([float(np.median(np.diff(t))) for t, _ in series]))
    times = _times(series, dt)
    grid = np.stack([np.interp(times, t, x) for t, x in series])
    node = grid.sum(axis=0)
    rms = high_frequency_rms(node, 1 / dt, 1.1)
    peak = float(np.percentile(node, 99.9))
    return rms / peak, noise_floor_ratio(grid, 1 / dt, 1.0)


def test_the_evidence_is_the_whole_grids_and_holds_no_whole_grid() -> None:
    series = _series(100_000)  # ~2.8 hours at 10 Hz
    hf, rough = whole_evidence_stats(series)
    tracemalloc.start()
    try:
        ev = averaging_evidence(series, 1.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ev.stats["high_frequency_rms_ratio"] == hf
    assert ev.stats["noise_floor_ratio"] == rough
    row = 100_000 * 8
    # the node's sum and its spectrum, a few rows' worth (~6.6); with the whole grid of
    # every GPU (8 rows) and its blocks of windows, 18.4
    assert peak < 9 * row
