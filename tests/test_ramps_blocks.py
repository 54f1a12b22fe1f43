"""The ramp and dip detection works on a long node power a block at a time: each block's
results are those of the whole arrays, bit for bit (block edges, clipped windows and
the last partial block included), and a long signal holds a few arrays of it, not ~25."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from exporter.analysis.ramps import (
    _after,
    _before,
    _first_return,
    _level_checks,
    _rolling,
    _signs,
    detect_dips,
    detect_ramps,
)
from tests.test_ramps_fast import reference_ramps

T0 = 1_758_000_000.0


# --- the whole-array code these replace, as it was -----------------------------------


def whole_boundary_means(x: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray]:
    n = x.size
    csum = np.concatenate([[0.0], np.cumsum(x)])
    e = np.arange(n + 1)
    n_before, n_after = np.minimum(e, h), np.minimum(n - e, h)
    before = (csum - csum[e - n_before]) / np.maximum(n_before, 1)
    after = (csum[e + n_after] - csum) / np.maximum(n_after, 1)
    return before, after


def whole_level_checks(x: np.ndarray, w: int, h: int, min_side: int, thr: float,
                       max_drift: float) -> tuple[np.ndarray, np.ndarray]:
    before, after = whole_boundary_means(x, h)
    n = x.size
    c = np.arange(n)
    i_b0, i_b1 = np.clip(c - w - h, 0, n), np.clip(c - w, 0, n)
    i_a0, i_a1 = np.minimum(c + w, n), np.minimum(c + w + h, n)
    sizes = np.arange(n + 1)
    long_b, long_a = np.minimum(sizes, h) >= min_side, np.minimum(n - sizes, h) >= min_side
    ok = long_b[i_b1] & long_a[i_a0]
    b1, a0 = before[i_b1], after[i_a0]
    b0 = np.where(long_b[i_b0], before[i_b0], b1)
    a1 = np.where(long_a[i_a1], after[i_a1], a0)
    hi_before, lo_before = np.maximum(b0, b1), np.minimum(b0, b1)
    hi_after, lo_after = np.maximum(a0, a1), np.minimum(a0, a1)
    drift = np.maximum(hi_before - lo_before, hi_after - lo_after)
    margin = 8 * n * n * np.finfo(float).eps * float(np.abs(x).max()) + 1e-9 * thr
    counts = []
    for gap in (lo_after - hi_before, lo_before - hi_after):
        could = ok & (gap >= thr - margin) & (drift <= max_drift * (gap + margin) + margin)
        counts.append(np.concatenate([[0], np.cumsum(could)]))
    return counts[0], counts[1]


def whole_rolling(x: np.ndarray, w: int, fn: str, trailing: bool = False) -> np.ndarray:
    if w <= 1:
        return x.copy()
    pad = (w - 1, 0) if trailing else (w // 2, w - 1 - w // 2)
    view = np.lib.stride_tricks.sliding_window_view(np.pad(x, pad, mode="edge"), w)
    return view.max(axis=1) if fn == "max" else view.min(axis=1)


def whole_first_return(level: np.ndarray, i: int, pre: float) -> int | None:
    run_min = np.minimum.accumulate(level[i:])
    back = np.flatnonzero(level[i:] >= (pre + run_min) / 2)
    return None if back.size == 0 else i + int(back[0])


def _node(n: int, seed: int = 0) -> np.ndarray:
    """Node power: a 2.5 s step swing at 10 Hz, level changes, pauses and noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) * 0.1
    x = np.where((t % 2.5) < 1.7, 5000.0, 4000.0) + rng.normal(0.0, 60.0, n)
    x[(t % 600.0) < 20.0] = 800.0 + rng.normal(0.0, 20.0, int(((t % 600.0) < 20.0).sum()))
    x[n // 3:n // 2] -= 2500.0  # a level that holds, then comes back
    return x


# --- the pieces, block against whole --------------------------------------------------


@pytest.mark.parametrize("block", [1, 7, 64, 1000, 1 << 16])
def test_level_checks_a_block_at_a_time_equal_the_whole_arrays(block: int) -> None:
    for n, w, h in ((997, 50, 125), (3001, 3, 7), (40, 50, 125), (130, 10, 60)):
        x = _node(n, seed=n)
        csum = np.concatenate([[0.0], np.cumsum(x)])
        min_side = max(1, h // 3)
        want = whole_level_checks(x, w, h, min_side, 2000.0, 0.25)
        got = _level_checks(x, csum, w, h, min_side, 2000.0, 0.25, block=block)
        for g, wnt in zip(got, want, strict=True):
            assert g.tolist() == wnt.tolist()


def test_boundary_means_at_any_boundary_equal_the_whole_arrays() -> None:
    x = _node(1001)
    csum = np.concatenate([[0.0], np.cumsum(x)])
    for h in (1, 2, 125, 2000):
        before, after = whole_boundary_means(x, h)
        e = np.arange(x.size + 1)
        assert _before(csum, e, h).tobytes() == before.tobytes()
        assert _after(csum, e, h).tobytes() == after.tobytes()
        some = np.array([0, 1, 500, x.size - 1, x.size])  # ends and a middle, alone
        assert _before(csum, some, h).tobytes() == before[some].tobytes()
        assert _after(csum, some, h).tobytes() == after[some].tobytes()


@pytest.mark.parametrize("block", [1, 5, 333, 1 << 16])
def test_signs_a_block_at_a_time_equal_the_whole_arrays(block: int) -> None:
    x = _node(1000)
    for w in (1, 50, 999):
        d = x[w:] - x[:-w]
        want = np.where(d >= 2000.0, 1, np.where(d <= -2000.0, -1, 0))
        got = _signs(x, w, 2000.0, block=block)
        assert got.dtype == np.int8 and got.tolist() == want.tolist()


@pytest.mark.parametrize("block", [1, 2, 9, 100, 1 << 16])
def test_rolling_extremes_a_block_at_a_time_equal_the_padded_sliding_window(block: int
                                                                             ) -> None:
    rng = np.random.default_rng(2)
    for n in (1, 5, 17, 1001):
        x = rng.normal(size=n)
        for w in (1, 2, 3, 8, 50, 2000):
            for fn in ("max", "min"):
                for trailing in (False, True):
                    want = whole_rolling(x, w, fn, trailing)
                    got = _rolling(x, w, fn, trailing, block=block)
                    assert got.tobytes() == want.tobytes(), (n, w, fn, trailing)


@pytest.mark.parametrize("block", [1, 3, 1024, 1 << 16])
def test_first_return_a_block_at_a_time_is_the_whole_searchs(block: int) -> None:
    level = _rolling(_rolling(_node(5000), 25, "max"), 25, "min")
    pre = float(level.max())
    for i in (0, 1, 199, 1000, 1667, 1700, 4999):
        assert _first_return(level, i, pre, block=block) == whole_first_return(level, i, pre)
    falls = np.r_[np.full(10, 100.0), np.linspace(100.0, 0.0, 3000)]  # never comes back
    assert _first_return(falls, 100, 100.0, block=block) is None
    assert whole_first_return(falls, 100, 100.0) is None


# --- the detectors on a signal of several blocks --------------------------------------


def whole_detect_dips(t: np.ndarray, x: np.ndarray, *, min_ratio: float = 0.30,
                      fill_seconds: float = 2.0, context_seconds: float = 30.0,
                      max_seconds: float = 300.0) -> list:
    """detect_dips with the whole-array rolling extremes and return search."""
    from exporter.analysis.ramps import _measure_dip, _regular
    grid, x, dt = _regular(t, x, 8)
    w = max(1, int(round(fill_seconds / dt)))
    c = max(2, int(round(context_seconds / dt)))
    level = whole_rolling(whole_rolling(x, w, "max"), w, "min")
    before = whole_rolling(level, c, "max", trailing=True)
    dips = []
    i = 1
    while i < x.size:
        pre = float(before[i - 1])
        if not level[i] < (1 - min_ratio) * pre:
            i += 1
            continue
        j = whole_first_return(level, i, pre)
        if j is None:
            break
        if (j - i) * dt <= max_seconds:
            dip = _measure_dip(x, grid, i, j, w, c, min_ratio)
            if dip is not None:
                dips.append(dip)
        i = j + 1
    return dips


def test_ramps_and_dips_of_a_signal_of_several_blocks_are_the_whole_arrays() -> None:
    n = 200_000  # over three blocks of 2**16 samples: changes across block edges
    x = _node(n)
    t = T0 + np.arange(n) * 0.1
    got = detect_ramps(t, x, 8 * 700.0)
    assert got == reference_ramps(t, x, 8 * 700.0)
    assert len(got) >= 2  # the level step down and back
    dips = detect_dips(t, x, fill_seconds=2.5)
    assert dips == whole_detect_dips(t, x, fill_seconds=2.5)
    assert len(dips) >= 30  # a checkpoint pause every 10 minutes


def test_ramps_of_a_long_node_hold_a_few_arrays_of_it() -> None:
    n = 400_000
    x = _node(n)
    t = T0 + np.arange(n) * 0.1
    tracemalloc.start()
    try:
        detect_ramps(t, x, 8 * 700.0)
        detect_dips(t, x, fill_seconds=2.5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the regular grid, its power, the cumulative sum, the prefix counts and a few
    # transient arrays (~5.5): the whole-array code held ~29 arrays of 8 bytes a sample
    assert peak < 7 * n * 8


def test_resampling_a_long_finite_row_copies_nothing_and_is_numpys_interp() -> None:
    from exporter.analysis.signal import resample

    n = 300_000
    t = T0 + np.arange(n) * 0.1  # not exactly uniform from T0: interpolated
    x = _node(n)
    tracemalloc.start()
    try:
        grid, out = resample(t, x)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rel = t - t[0]
    step = float(np.median(np.diff(t)))
    want = np.interp(np.arange(n) * step, rel, x)
    assert out[0].tobytes() == want.tobytes()
    assert grid.tobytes() == (t[0] + np.arange(n) * step).tobytes()
    # the output, the relative times and a block of grid times, then the grid (~3.5)
    assert peak < 4.5 * n * 8  # whole-grid interpolation with its slopes and copies: 7.6
