"""What the exporter holds stays what it needs: nothing made for a feature that is off,
nothing that grows with uptime."""

from __future__ import annotations

from exporter.gpu.backend import NvmlBackend
from exporter.sampling.clock import ManualClock
from exporter.sampling.sampler import Sampler, SamplerSettings
from exporter.sim import costs, fake
from exporter.sim.scenarios import load_scenario
from tests.tools import fresh_python


def test_the_fake_without_costs_holds_no_burn_buffer():
    costs._zeros.cache_clear()
    clock = ManualClock()
    with fake.installed(load_scenario("training"), clock, costs=None):
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake"), clock=clock)
        sampler.start(threads=False)
        try:
            sampler.advance(5)
        finally:
            sampler.stop()
    assert costs._zeros.cache_info().currsize == 0
    costs.burn(0.0005)  # the costs on: the first burn makes it
    assert len(costs._zeros()) == costs._CHUNK_MAX


RING_IN_A_FRESH_PROCESS = """
import numpy as np
from exporter.sampling.buffers import PowerBuffer

def resident_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))

before = resident_kib()
ring = PowerBuffer(8, 64 * 660, 660.0)  # run's ring for 8 GPUs: 2.6 MiB
assert ring.nbytes > 2_500_000
grown = resident_kib() - before
assert grown < 1024, grown  # the pages are the kernel's zeros until written
assert ring.latest_time() is None and ring.window(0, 60)[0].size == 0
t = 1_790_000_000.0 + np.arange(100) * 0.02
ring.append(3, t, np.full(100, 512.25))
times, watts = ring.window(3, 60)
assert times.tolist() == t.tolist() and set(watts.tolist()) == {512.25}
assert ring.window(2, 60)[0].size == 0  # a GPU with no samples reads none, not zeros
grid_t, grid_w = ring.grid(1.0, 0.1)
assert np.isnan(grid_w[2]).all() and not np.isnan(grid_w[3]).all()
"""


def test_the_power_ring_is_resident_as_it_fills_not_at_start():
    """In a fresh interpreter, as `run` makes it: in a process that has freed large
    arrays before (this test run), glibc may hand back pages already resident."""
    _in_a_fresh_process(RING_IN_A_FRESH_PROCESS)


FULL_RING_IN_A_FRESH_PROCESS = """
import numpy as np
from exporter.sampling.buffers import PowerBuffer

def resident_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))

stamps = 1_790_000_000_000_000 + np.cumsum(np.full(64 * 660 + 500, 20_000))
seconds = stamps.astype(float) / 1e6  # the drain's times: whole microseconds
parts = np.array_split(np.arange(stamps.size), 900)

def fill(ring, gpus):
    for gpu in range(gpus):
        for part in parts:
            ring.append(gpu, seconds[part], np.full(part.size, 612.5))

warm = PowerBuffer(1, 64 * 660, 660.0)  # first calls allocate for themselves: not counted
fill(warm, 1)
before = resident_kib()
ring = PowerBuffer(8, 64 * 660, 660.0)
fill(ring, 8)
grown = (resident_kib() - before) / 1024
assert 2.0 < grown < 3.2, f"{grown:.2f} MiB"  # 2.58 MiB of pages, and some slack
times, watts = ring.window(5, 660.0)
assert np.array_equal(times, seconds[-33000:])
assert set(watts.tolist()) == {612.5}
"""


def test_a_full_power_ring_holds_8_bytes_a_sample():
    """Once its window is full, run's ring for 8 GPUs (64 x 660 slots each) is resident:
    uint32 microseconds and float32 milliwatts, 2.6 MiB (float64 seconds made it 3.9)."""
    _in_a_fresh_process(FULL_RING_IN_A_FRESH_PROCESS)


def _in_a_fresh_process(code: str) -> None:
    from pathlib import Path

    import pytest

    if not Path("/proc/self/status").exists():
        pytest.skip("no /proc/self/status")
    fresh_python(code)
