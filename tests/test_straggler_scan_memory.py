"""The offline stall scan on a long grid: its moving means made a block of windows at a
time hold a fraction of the grid, and are the means one pass over each row gives, bit
for bit (NaN, holes and block edges included)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from exporter.analysis import straggler_scan
from exporter.analysis.straggler import StragglerThresholds
from exporter.analysis.straggler_scan import _moving_mean_blocks, scan


def _one_pass(x: np.ndarray, k: int) -> np.ndarray:
    """The mean of each k consecutive samples of each row, ignoring NaN, in one pass."""
    out = np.full((x.shape[0], x.shape[1] - k + 1), np.nan)
    for i, row in enumerate(x):
        ok = np.isfinite(row)
        cs = np.cumsum(np.concatenate([[0.0], np.where(ok, row, 0.0)]))
        cn = np.cumsum(np.concatenate([[0.0], ok.astype(float)]))
        s, c = cs[k:] - cs[:-k], cn[k:] - cn[:-k]
        np.divide(s, c, out=out[i], where=c > 0)
    return out


@pytest.mark.parametrize("block", [1, 7, 50, 1000])
def test_block_means_equal_one_pass_bit_for_bit(block):
    rng = np.random.default_rng(3)
    x = rng.normal(300.0, 80.0, (3, 997)) * rng.uniform(0.1, 10.0, (3, 1))
    x[0, 100:180] = np.nan  # a hole longer than a window: windows with no sample
    x[1, ::13] = np.nan
    x[2, 500] = np.inf
    every = rng.uniform(size=997) > 0.05
    for k in (1, 5, 50):
        want = _one_pass(np.where(every, x, np.nan), k)
        got = np.concatenate(list(_moving_mean_blocks(x, k, block, every)), axis=1)
        assert got.shape == want.shape
        assert got.tobytes() == want.tobytes()
        plain = np.concatenate(list(_moving_mean_blocks(x, k, block)), axis=1)
        assert plain.tobytes() == _one_pass(x, k).tobytes()


def test_block_means_of_a_grid_shorter_than_a_window_are_none():
    assert list(_moving_mean_blocks(np.ones((2, 4)), 5, 3)) == []


def _long_grid(m: int, gpus: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    t = np.arange(m) * 0.1
    phase = (t % 2.5) < 1.7
    power = np.where(phase, 640.0, 260.0) + rng.normal(0.0, 12.0, (gpus, m))
    util = np.where(phase, 100.0, 35.0) + np.zeros((gpus, m))
    # a stall every 10 minutes: GPU 3 stops at low power and low utilization while the
    # others busy-wait at full utilization and low power
    stalled = (t % 600.0) > 580.0
    power[:, stalled] = 200.0
    util[3, stalled] = 0.0
    return t, power, util


def _stalls(t, power, util, measured=None):
    return scan(t, power, utilization=util, window_seconds=60.0, step_seconds=1e5,
                thresholds=StragglerThresholds(persistence_seconds=300.0),
                stall_window_seconds=5.0,
                stall_context_seconds=120.0, measured=measured).stalls


def test_stall_scan_holds_a_fraction_of_the_grid():
    t, power, util = _long_grid(300_000)
    grid = power.nbytes
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        found = _stalls(t, power, util)
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    assert len(found) == 50  # one every 10 minutes of the 8 h 20 min
    assert {s.culprit_gpus for s in found} == {(3,)}
    # the means of every window at once were two grids; now the flags (a byte a
    # window and GPU) and a block's arrays
    assert peak < 0.75 * grid


def test_stalls_across_block_edges_and_holes_are_those_of_one_block(monkeypatch):
    """Results do not depend on the block size: the same stalls with blocks of 17
    windows as with one block for the whole grid."""
    t, power, util = _long_grid(40_000)
    measured = np.ones(power.shape, dtype=bool)
    measured[2, 10_000:10_300] = False  # a 30 s hole in one GPU's readings
    measured[:, 25_000:25_020] = False
    monkeypatch.setattr(straggler_scan, "_STALL_BLOCK", 1 << 30)
    whole = _stalls(t, power, util, measured)
    monkeypatch.setattr(straggler_scan, "_STALL_BLOCK", 17)
    assert _stalls(t, power, util, measured) == whole
    assert len(whole) >= 5


def test_packed_flags_read_back_any_run_of_windows():
    from exporter.analysis.straggler_scan import _bits

    rng = np.random.default_rng(4)
    for n in (1, 7, 8, 9, 100, 1003):
        flags = rng.uniform(size=(3, n)) > 0.7
        packed = np.packbits(flags, axis=1)
        assert packed.nbytes == 3 * ((n + 7) // 8)
        for a in range(0, n, 3):
            for b in (a + 1, min(n, a + 9), n):
                assert _bits(packed, a, b).tolist() == flags[:, a:b].tolist()
