"""The buffers' reads the straggler and stall checks make every second take shortcuts;
they must give exactly what the straightforward computations (below) give."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.sampling.buffers import PowerBuffer, SweepBuffer


def reference_grid(buf: PowerBuffer, seconds: float, dt: float, end: float | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The grid one GPU at a time, from its window()."""
    held = [buf.window(g, np.inf)[0] for g in range(buf.gpus)]
    newest = [float(times[-1]) for times in held if times.size]
    end = (max(newest) if newest else None) if end is None else end
    if end is None:
        return np.zeros(0), np.zeros((buf.gpus, 0))
    firsts = [float(times[0]) for times in held if times.size]
    start = max(end - seconds, min(firsts) if firsts else -np.inf)
    grid = end - dt * np.arange(int((end - start) / dt), -1, -1)
    out = np.full((buf.gpus, len(grid)), np.nan)
    for gpu in range(buf.gpus):
        times, watts = buf.window(gpu, seconds + 2 * dt, end)
        if len(times) < 2:
            continue
        row = np.interp(grid, times, watts)
        hole = max(4 * dt, 0.25)
        after = np.searchsorted(times, grid)
        before_t = times[np.maximum(after - 1, 0)]
        after_t = times[np.minimum(after, len(times) - 1)]
        row[(grid < times[0] - dt) | (grid > times[-1] + hole)
            | ((after_t - before_t) > hole)] = np.nan
        out[gpu] = row
    return grid, out


def random_buffer(rng: np.random.Generator, capacity: int, whole_micros: bool = False,
                  origin: float = 0.0) -> PowerBuffer:
    """GPUs at different rates with jitter, holes, a stale one and an empty one,
    appended in drains, so the ring wraps anywhere. whole_micros: the times whole
    microseconds after `origin`, as the driver stamps them (held in 32 bits); else any
    floats (held as float64)."""
    gpus = 5
    buf = PowerBuffer(gpus, capacity)
    for gpu in range(gpus - 1):
        interval = rng.choice([0.005, 0.02, 0.05, 0.15, 1.0])
        stop = 30.0 if gpu == 2 else 100.0  # GPU 2 lost at 30 s
        t = np.cumsum(rng.uniform(0.5, 1.5, int(stop / interval)) * interval) + rng.uniform(0, 5)
        t = t[t < stop]
        for a, b in rng.uniform(t[0], stop, (int(rng.integers(0, 4)), 2)):
            t = t[(t < min(a, b)) | (t > min(a, b) + rng.uniform(0.1, 3.0))]  # a hole
        if whole_micros:
            t = np.unique(np.round((t + origin) * 1e6)) / 1e6  # as the drain makes them
        watts = 100 + 400 * rng.random(t.size)
        for chunk in np.array_split(np.arange(t.size), max(1, t.size // 50)):
            buf.append(gpu, t[chunk], watts[chunk])
    return buf


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("whole_micros, origin", [(False, 0.0), (True, 0.0), (True, 1.79e9)])
def test_grid_is_exactly_the_per_gpu_interpolation(seed: int, whole_micros: bool,
                                                   origin: float) -> None:
    rng = np.random.default_rng(seed)
    buf = random_buffer(rng, int(rng.choice([64, 300, 5000, 30000])), whole_micros, origin)
    assert (buf.times.dtype == np.uint32) == whole_micros
    for seconds, dt in ((2.0, 0.1), (120.0, 0.1), (60.0, 0.02), (600.0, 0.2), (0.5, 0.02)):
        for end in (None, 99.0, 50.5, 29.9, 3.0, -5.0):
            end = None if end is None else origin + end
            want = reference_grid(buf, seconds, dt, end)
            got = buf.grid(seconds, dt, end)
            assert np.array_equal(got[0], want[0])
            assert np.array_equal(got[1], want[1], equal_nan=True), (seconds, dt, end)


def test_grid_of_an_empty_buffer() -> None:
    buf = PowerBuffer(3, 10)
    grid, watts = buf.grid(2.0, 0.1)
    assert grid.size == 0 and watts.shape == (3, 0)
    assert buf.latest_time() is None


def reference_sweep_window(buf: SweepBuffer, seconds: float, fields: tuple[str, ...]
                           ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The rows whose newest GPU time is within `seconds` of the newest row's."""
    n = min(buf.count, buf.capacity)
    order = np.arange(buf.count - n, buf.count) % buf.capacity
    times = buf.times[:, order]
    values = {name: buf.values[name][:, order] for name in fields}
    if n == 0 or not np.isfinite(times).any():
        return times[:, :0], {k: v[:, :0] for k, v in values.items()}
    row = np.nanmax(np.where(np.isfinite(times), times, -np.inf), axis=0)
    keep = row >= row.max() - seconds
    return times[:, keep], {k: v[:, keep] for k, v in values.items()}


@pytest.mark.parametrize("seed", range(6))
def test_sweep_window_is_the_rows_within_seconds_of_the_newest(seed: int) -> None:
    rng = np.random.default_rng(seed)
    buf = SweepBuffer(4, 40)
    t = 1000.0
    for sweep in range(int(rng.integers(0, 120))):
        t += 1.0 if rng.random() > 0.05 else -rng.uniform(0, 80)  # the clock steps back
        rows = {gpu: (t + rng.uniform(0, 0.05) if rng.random() > 0.1 else np.nan,
                      {"utilization_gpu_ratio": rng.random(), "sm_clock_hertz": 1e9})
                for gpu in range(-1, 5) if rng.random() > 0.2}  # GPUs missing, 2 unknown
        buf.append({} if sweep % 17 == 5 else rows)  # a sweep that read no GPU
        for seconds in (2.0, 10.0, 60.0):
            for fields in (SweepBuffer.FIELDS, ("utilization_gpu_ratio",)):
                want_t, want = reference_sweep_window(buf, seconds, fields)
                got_t, got = buf.window(seconds, fields)
                assert np.array_equal(got_t, want_t, equal_nan=True)
                assert list(got) == list(want)
                for name in want:
                    assert np.array_equal(got[name], want[name], equal_nan=True)


def test_power_is_held_in_8_bytes_a_sample_and_read_back_as_written() -> None:
    """NVML reports whole milliwatts: held as float32 mW, each reading comes back as the
    very float64 it was written as (mW / 1000), up to 16.7 kW."""
    rng = np.random.default_rng(3)
    milliwatts = rng.integers(0, 2**24, 500).astype(np.uint64)  # 0 to 16.7 kW
    watts = milliwatts / 1000.0  # as gpu/power.py makes them
    times = 1.79e9 + np.arange(500) * 0.02
    buffer = PowerBuffer(1, 600)
    buffer.append(0, times, watts)
    t, w = buffer.window(0, 20.0)
    assert w.dtype == np.float64 and np.array_equal(w, watts) and np.array_equal(t, times)
    _, gridded = buffer.grid(5.0, 0.02)
    assert gridded.dtype == np.float64
    assert buffer.nbytes == 600 * (4 + 4)  # uint32 microseconds, float32 milliwatts
    # a reading finer than a milliwatt (a replayed log) is kept to the nearest milliwatt
    buffer.append(0, np.array([times[-1] + 1]), np.array([300.1234]))
    assert buffer.window(0, 0.5)[1][-1] == pytest.approx(300.123, abs=1e-9)


def test_grid_of_float32_milliwatts_matches_float64_watts() -> None:
    """The analyses read the grid: the same values as a float64 ring gave."""
    rng = np.random.default_rng(4)
    times = 1.79e9 + np.cumsum(rng.uniform(0.015, 0.025, 3000))
    watts = rng.integers(100_000, 700_000, 3000) / 1000.0
    buffer = PowerBuffer(1, 4000)
    buffer.append(0, times, watts)
    grid, out = buffer.grid(50.0, 0.02)
    assert np.array_equal(out[0], np.interp(grid, times, watts))


def _held(appended: list[np.ndarray], capacity: int) -> np.ndarray:
    everything = np.concatenate(appended) if appended else np.zeros(0)
    return everything[-capacity:]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("capacity", [50, 700, 5000])
def test_windows_of_microsecond_times_are_the_times_written(seed: int, capacity: int) -> None:
    """Times held as 32-bit microseconds read back as the very float64 seconds written, and
    a window's bounds (start < t <= end) fall exactly where they fall on those floats,
    a bound on a sample's own time included; over hours, past what 32 bits of
    microseconds span (the epoch moves on with the samples)."""
    rng = np.random.default_rng(seed)
    ring = PowerBuffer(2, capacity)
    appended: list[list[np.ndarray]] = [[], []]
    stamp = [int(1.79e15) + int(rng.integers(0, 10**9))] * 2  # the driver's microseconds
    for drain in range(400):
        for gpu in range(2):
            n = int(rng.integers(0, 80))
            steps = rng.integers(15_000, 25_000, n)
            if drain % 200 == 13 and n:
                steps[0] = 3_000_000_000  # a GPU silent for 50 minutes
            stamps = stamp[gpu] + np.cumsum(steps)
            stamp[gpu] = int(stamps[-1]) if n else stamp[gpu]
            times = stamps.astype(float) / 1e6  # as the drain makes them
            ring.append(gpu, times, rng.integers(50_000, 700_000, n) / 1000.0)
            appended[gpu].append(times)
        if drain % 23:
            continue
        assert ring.times.dtype == np.uint32
        for gpu in range(2):
            held = _held(appended[gpu], capacity)
            got_t, got_w = ring.window(gpu, np.inf)
            assert np.array_equal(got_t, held)
            if held.size < 2:
                continue
            for _ in range(10):
                a, b = np.sort(rng.choice(held, 2))
                for end, seconds in ((b, b - a), (b + 1e-7, b - a), (b - 1e-7, b - a - 2e-7),
                                     (np.nextafter(b, 0), b - np.nextafter(a, 0))):
                    t, _ = ring.window(gpu, seconds, end)
                    start = end - seconds
                    assert np.array_equal(t, held[(held > start) & (held <= end)])


def test_a_time_not_a_whole_microsecond_turns_the_ring_to_float64_seconds() -> None:
    """A polled GPU's wall clock (or a re-based driver clock) is kept exactly too."""
    ring = PowerBuffer(2, 100)
    stamps = 1.79e9 + np.arange(60) * 0.02
    ring.append(0, stamps, np.full(60, 300.0))
    ring.append(1, stamps[:30], np.full(30, 200.0))
    assert ring.times.dtype == np.uint32
    polled = stamps[-1] + np.array([0.1234567891, 0.2234567891])
    ring.append(1, polled, np.array([250.0, 260.0]))
    assert ring.times.dtype == np.float64 and ring.nbytes == 2 * 100 * (8 + 4)
    assert np.array_equal(ring.window(0, np.inf)[0], stamps)
    assert np.array_equal(ring.window(1, np.inf)[0], np.concatenate([stamps[:30], polled]))
    assert ring.window(1, 0.15)[1].tolist() == [250.0, 260.0]
    ring.append(0, np.array([stamps[-1] + 1.0]), np.array([1.0]))
    assert ring.window(0, 0.5)[0].tolist() == [stamps[-1] + 1.0]


def test_samples_held_over_more_than_71_minutes_turn_the_ring_to_float64_seconds() -> None:
    """32 bits of microseconds span 71.6 minutes: a GPU whose held samples span more
    (silent for over an hour, its ring not yet wrapped) keeps them all, as float64."""
    ring = PowerBuffer(1, 100)
    first = 1.79e9 + np.arange(10) * 0.02
    ring.append(0, first, np.full(10, 300.0))
    later = first[-1] + 4300.0 + np.arange(10) * 0.02
    ring.append(0, later, np.full(10, 310.0))
    assert ring.times.dtype == np.float64
    assert np.array_equal(ring.window(0, np.inf)[0], np.concatenate([first, later]))
    hours = PowerBuffer(1, 10)  # a GPU read on for hours: the epoch moves with the ring
    for hour in range(5):
        hours.append(0, first + 3600.0 * hour, np.full(10, 300.0))
    assert hours.times.dtype == np.uint32
    assert np.array_equal(hours.window(0, 10.0)[0], first + 3600.0 * 4)


def test_a_grid_to_the_newest_sample_searches_each_run_once_and_reads_one_oldest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stall check's grid, every second: each GPU's run is searched for its start
    only (it ends at the newest sample), the newest time is what was written, and the
    oldest samples are read only until one GPU reaches back past the window. Same grid."""
    rng = np.random.default_rng(3)
    buf = random_buffer(rng, 30000, whole_micros=True, origin=1.79e9)
    want = reference_grid(buf, 2.0, 0.1)
    searches, oldest_reads = [], []
    after, time_at = PowerBuffer._after, PowerBuffer._time_at
    monkeypatch.setattr(PowerBuffer, "_after", lambda self, *a: searches.append(a) or after(
        self, *a))
    monkeypatch.setattr(PowerBuffer, "_time_at", lambda self, *a: oldest_reads.append(a)
                        or time_at(self, *a))
    got = buf.grid(2.0, 0.1)
    assert np.array_equal(got[0], want[0])
    assert np.array_equal(got[1], want[1], equal_nan=True)
    runs = sum(len(buf._segments(g)) for g in range(buf.gpus))
    assert len(searches) == runs  # one search per run, not two
    assert len(oldest_reads) == 1  # the first GPU holds samples older than the window
    newest = max(float(buf.window(g, np.inf)[0][-1]) for g in range(buf.gpus) if buf.count[g])
    oldest_reads.clear()
    assert buf.latest_time() == newest
    assert oldest_reads == []  # the newest time is not read back from the ring


@pytest.mark.parametrize("seed", range(4))
def test_a_drain_that_hands_over_its_microseconds_fills_the_ring_the_same(seed: int) -> None:
    """The power drain gives the ring the driver's whole microseconds with the times made
    of them: the ring then skips working them out again, and holds exactly what it holds
    from the times alone (over drains that overlap the newest, overfill the ring and
    outlast what 32 bits of microseconds span)."""
    rng = np.random.default_rng(seed)
    given, worked_out = PowerBuffer(2, 64), PowerBuffer(2, 64)
    stamp = int(1.79e15) + int(rng.integers(0, 10**9))
    for drain in range(300):
        n = int(rng.integers(1, 120))  # past the capacity at times
        steps = rng.integers(15_000, 25_000, n)
        if drain % 100 == 7:
            steps[0] = 3_000_000_000  # silent for 50 minutes: the epoch moves on
        micros = (stamp + np.cumsum(steps)).astype(np.uint64)
        if drain % 9 == 4:
            micros = np.concatenate([micros[:1] - np.uint64(40_000), micros])  # overlaps
        stamp = int(micros[-1])
        times = micros.astype(float) / 1e6  # as the drain makes them
        watts = rng.integers(50_000, 700_000, micros.size) / 1000.0
        given.append(drain % 2, times, watts, micros)
        worked_out.append(drain % 2, times, watts)
        assert given.times.dtype == worked_out.times.dtype == np.uint32
        assert np.array_equal(given.times, worked_out.times)
        assert np.array_equal(given.milliwatts, worked_out.milliwatts)
        assert given._epoch == worked_out._epoch and given.count == worked_out.count
        for gpu in range(2):
            a, b = given.window(gpu, np.inf), worked_out.window(gpu, np.inf)
            assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
