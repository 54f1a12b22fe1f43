"""PowerBuffer.grid grids all GPUs from one copy of the ring; it must give exactly what
gridding each GPU's own window with np.interp gives (the straightforward way, below)."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.sampling.buffers import PowerBuffer


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


def random_buffer(rng: np.random.Generator, capacity: int) -> PowerBuffer:
    """GPUs at different rates with jitter, holes, a stale one and an empty one,
    appended in drains, so the ring wraps anywhere."""
    gpus = 5
    buf = PowerBuffer(gpus, capacity)
    for gpu in range(gpus - 1):
        interval = rng.choice([0.005, 0.02, 0.05, 0.15, 1.0])
        stop = 30.0 if gpu == 2 else 100.0  # GPU 2 lost at 30 s
        t = np.cumsum(rng.uniform(0.5, 1.5, int(stop / interval)) * interval) + rng.uniform(0, 5)
        t = t[t < stop]
        for a, b in rng.uniform(t[0], stop, (int(rng.integers(0, 4)), 2)):
            t = t[(t < min(a, b)) | (t > min(a, b) + rng.uniform(0.1, 3.0))]  # a hole
        watts = 100 + 400 * rng.random(t.size)
        for chunk in np.array_split(np.arange(t.size), max(1, t.size // 50)):
            buf.append(gpu, t[chunk], watts[chunk])
    return buf


@pytest.mark.parametrize("seed", range(12))
def test_grid_is_exactly_the_per_gpu_interpolation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    buf = random_buffer(rng, int(rng.choice([64, 300, 5000, 30000])))
    for seconds, dt in ((2.0, 0.1), (120.0, 0.1), (60.0, 0.02), (600.0, 0.2), (0.5, 0.02)):
        for end in (None, 99.0, 50.5, 29.9, 3.0, -5.0):
            want = reference_grid(buf, seconds, dt, end)
            got = buf.grid(seconds, dt, end)
            assert np.array_equal(got[0], want[0])
            assert np.array_equal(got[1], want[1], equal_nan=True), (seconds, dt, end)


def test_grid_of_an_empty_buffer() -> None:
    buf = PowerBuffer(3, 10)
    grid, watts = buf.grid(2.0, 0.1)
    assert grid.size == 0 and watts.shape == (3, 0)
    assert buf.latest_time() is None
