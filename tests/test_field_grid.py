"""A trace field on analyze's grid made a block of columns at a time (the straggler
scan's signals): every block holds, bit for bit, what the whole grid held (interpolated
and held fields, NaN runs, gaps, readings that start late or end early, block edges), and
the scan on them finds what it found on the whole grids while holding far less."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from exporter.analysis.straggler import StragglerThresholds
from exporter.analysis.straggler_scan import scan
from exporter.offline.field_grid import FieldGrid
from exporter.offline.gaps import gpu_gaps
from exporter.traces.trace import GpuSeries, PackedFields

T0 = 1_758_000_000.0


def whole_grid(series: list[GpuSeries], name: str, t0: float, rel: np.ndarray, dt: float
               ) -> np.ndarray:
    """The whole grid as analyze made it before it was made a block at a time."""
    out = np.full((len(series), rel.size), np.nan)
    for i, s in enumerate(series):
        x = s.fields[name]
        ok = np.isfinite(x)
        if not ok.any():
            continue
        ts, xs = s.t[ok] - t0, x[ok]
        if name == "clock_event_reasons":
            idx = np.searchsorted(ts, rel, side="right") - 1
            out[i] = np.where(idx >= 0, xs[np.maximum(idx, 0)], np.nan)
            out[i, rel > ts[-1] + 5 * dt + 5.0] = np.nan
        else:
            out[i] = np.interp(rel, ts, xs, left=np.nan, right=np.nan)
        for a, b in gpu_gaps(ts):
            out[i, (rel > a) & (rel < b)] = np.nan
    return out


def _series(n: int = 5000) -> tuple[list[GpuSeries], np.ndarray, float]:
    """Four GPUs read every ~1 s (jittered), the grid at 0.1 s: one GPU with NaN runs,
    one that starts late and ends early, one with a gap in its readings."""
    rng = np.random.default_rng(7)
    out = []
    for g in range(4):
        t = T0 + np.cumsum(rng.uniform(0.8, 1.2, n))
        util = np.round(rng.uniform(0, 100, n)) * 0.01
        clocks = rng.integers(0, 5, n).astype(float)
        if g == 1:
            util[100:400] = np.nan  # a long run of missing readings
            util[1000::37] = np.nan
            clocks[50:60] = np.nan
        if g == 2:
            util[:300] = np.nan  # starts late, ends early
            util[-200:] = np.nan
        if g == 3:
            t[2000:] += 60.0  # a minute without readings: a gap
        fields = {"utilization_gpu_ratio": util.astype(np.float32) / np.float32(1),
                  "clock_event_reasons": clocks.astype(np.float32)}
        out.append(GpuSeries(g, t, PackedFields(fields, {"utilization_gpu_ratio": 1.0,
                                                         "clock_event_reasons": 1.0})))
    t0 = max(float(s.t[0]) for s in out) - 3.0  # a little before one GPU's first reading
    dt = 0.1
    rel = np.arange(int((min(float(s.t[-1]) for s in out) - t0) / dt) + 50) * dt
    return out, rel, t0


@pytest.mark.parametrize("name", ["utilization_gpu_ratio", "clock_event_reasons"])
@pytest.mark.parametrize("block", [1, 7, 999, 1 << 16])
def test_blocks_hold_the_whole_grids_values(name: str, block: int) -> None:
    series, rel, t0 = _series()
    want = whole_grid(series, name, t0, rel, 0.1)
    fg = FieldGrid(series, name, t0, rel, 0.1, block=block)
    assert fg.shape == want.shape
    assert fg.block(0, rel.size).tobytes() == want.tobytes()
    # windows read in order, as the scan does, some across block edges
    for a in range(0, rel.size - 600, 97):
        assert fg[:, a:a + 600].tobytes() == want[:, a:a + 600].tobytes()
    # and out of order, and at the ends
    for a, b in ((rel.size - 5, rel.size), (0, 3), (20_000, 20_001), (3, 40_000)):
        assert fg[:, a:b].tobytes() == want[:, a:b].tobytes()
    assert fg[:, 5:3].shape == (4, 0)  # an empty read, wherever the block is
    assert np.isnan(want).any() and np.isfinite(want).any()
    assert fg.any_finite()


def test_a_gpu_without_the_field_or_any_reading_is_nan_and_a_grid_of_none_says_so() -> None:
    series, rel, t0 = _series(300)
    bare = GpuSeries(9, series[0].t, {"utilization_gpu_ratio": np.full(300, np.nan)})
    fg = FieldGrid([series[0], bare], "utilization_gpu_ratio", t0, rel, 0.1, block=50)
    assert fg.has_readings and np.isnan(fg[:, 0:rel.size][1]).all()
    none = FieldGrid([bare], "utilization_gpu_ratio", t0, rel, 0.1)
    assert not none.has_readings and not none.any_finite()
    # readings all after the grid: a grid of NaN, found so without a whole grid
    late = GpuSeries(0, series[0].t + 1e6, series[0].fields)
    assert not FieldGrid([late], "utilization_gpu_ratio", t0, rel, 0.1, block=64).any_finite()


def test_only_whole_column_blocks_are_read() -> None:
    series, rel, t0 = _series(300)
    fg = FieldGrid(series, "utilization_gpu_ratio", t0, rel, 0.1)
    with pytest.raises(IndexError):
        fg[0, 0:10]  # type: ignore[index]
    with pytest.raises(IndexError):
        fg[:, 0:10:2]


def _scan_inputs(m: int, gpus: int = 8) -> tuple[np.ndarray, np.ndarray, list[GpuSeries]]:
    """A long trace: a 2.5 s step swing, GPU 3 stalling every 10 minutes while the others
    busy-wait, GPU 5 hotter; utilization, temperature and clocks read every second."""
    rng = np.random.default_rng(0)
    t = np.arange(m) * 0.1
    phase = (t % 2.5) < 1.7
    stalled = (t % 600.0) > 580.0
    power = np.where(phase, 640.0, 260.0) + rng.normal(0.0, 12.0, (gpus, m))
    power[:, stalled] = 200.0
    ts = T0 + t[::10]
    series = []
    for g in range(gpus):
        util = np.where(phase[::10], 1.0, 0.35)
        util = np.where(stalled[::10] & (g == 3), 0.0, util)
        temp = 62.0 + 8.0 * (g == 5) + np.round(rng.normal(0.0, 0.7, ts.size))
        sm = 1980e6 - 15e6 * rng.integers(0, 3, ts.size)
        series.append(GpuSeries(g, ts, {"utilization_gpu_ratio": util,
                                        "temperature_celsius": temp, "sm_clock_hertz": sm}))
    return T0 + t, power, series


def test_the_scan_on_blocks_finds_what_it_found_on_whole_grids_and_holds_less() -> None:
    t, power, series = _scan_inputs(120_000)  # 200 minutes at 10 Hz
    t0, rel = float(t[0]), t - t[0]
    names = {"utilization": "utilization_gpu_ratio", "temperature": "temperature_celsius",
             "sm_clock": "sm_clock_hertz"}
    kw = dict(gpus=list(range(8)), window_seconds=60.0, step_seconds=10.0,
              thresholds=StragglerThresholds(persistence_seconds=60.0), stall_window_seconds=2.0,
              stall_context_seconds=60.0)
    whole = {k: whole_grid(series, f, t0, rel, 0.1) for k, f in names.items()}
    want = scan(rel, power, **kw, **whole)
    del whole
    lazy = {k: FieldGrid(series, f, t0, rel, 0.1, block=4096) for k, f in names.items()}
    tracemalloc.start()
    try:
        got = scan(rel, power, **kw, **lazy)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == want
    assert got.stalls and any(o.gpu == 5 for o in got.outliers)
    # three whole signal grids are 3 x 8 x 8 bytes a sample (23 MB here); the blocks and
    # the stall check's own block of windows (a fixed ~7 MB) are a fraction
    assert peak < 0.5 * 3 * power.nbytes


def test_gpus_sharing_their_times_find_the_gaps_once_and_hold_the_whole_values() -> None:
    series, rel, t0 = _series(3000)
    shared = series[3].t  # with a gap
    twins = [GpuSeries(g, shared, series[3].fields) for g in range(3)]
    cache: dict = {}
    want = whole_grid(twins, "utilization_gpu_ratio", t0, rel, 0.1)
    fgs = [FieldGrid(twins, name, t0, rel, 0.1, block=500, gap_cache=cache)
           for name in ("utilization_gpu_ratio", "clock_event_reasons")]
    assert list(cache) == [id(shared)] and len(cache[id(shared)][1]) == 1
    assert fgs[0].gaps == [cache[id(shared)][1]] * 3
    assert fgs[0].block(0, rel.size).tobytes() == want.tobytes()


def test_which_packed_readings_are_finite_is_read_without_unpacking() -> None:
    f = PackedFields({"a": np.float32([1.0, np.nan, 3.0]), "b": np.array([np.inf, 2.0])},
                     {"a": 1e6})
    assert "a" in f and "c" not in f
    assert f.finite("a").tolist() == [True, False, True]
    assert f.finite("b").tolist() == [False, True]
