"""Sampler: loops keep their rate, buffers stay bounded, faults never stop publishing."""

from __future__ import annotations

import time

import numpy as np
import pytest

from exporter.gpu.backend import NvmlBackend
from exporter.gpu.state import PowerSample
from exporter.sampling.sampler import PowerBuffer, Sampler, SamplerSettings
from exporter.sim import fake
from exporter.sim.scenarios import load_scenario
from tests.tools import scenario_from_yaml, wait_for


def test_power_buffer_is_bounded_and_windows_by_time():
    buf = PowerBuffer(gpus=2, capacity=10)
    for i in range(25):
        buf.append([PowerSample(1000.0 + i, float(i), 5.0 * i),
                    PowerSample(1000.0 + i, None, None)])
    assert buf.count == 25
    times, watts, joules = buf.window(1e9)
    assert times.shape == (2, 10)  # only the newest 10 rows are kept
    assert list(watts[0]) == [float(i) for i in range(15, 25)]
    assert np.isnan(watts[1]).all()  # a failed read is a gap, not a zero
    times, watts, _ = buf.window(3.0)
    assert list(times[0]) == [1021.0, 1022.0, 1023.0, 1024.0]
    nbytes = buf.nbytes
    for i in range(1000):
        buf.append([PowerSample(2000.0 + i, 1.0, 1.0)] * 2)
    assert buf.nbytes == nbytes


def test_empty_buffer_window():
    times, watts, _ = PowerBuffer(gpus=3, capacity=4).window(10)
    assert times.shape == (3, 0) and watts.shape == (3, 0)


@pytest.fixture
def running_sampler():
    snapshots = []
    with fake.installed(load_scenario("training")):
        sampler = Sampler(NvmlBackend(), SamplerSettings(power_hertz=20, backend="fake",
                                                         scenario="training"),
                          on_snapshot=snapshots.append)
        sampler.start()
        try:
            yield sampler, snapshots
        finally:
            sampler.stop()


def test_sampler_publishes_snapshots_with_all_gpus(running_sampler):
    sampler, snapshots = running_sampler
    wait_for(lambda: len(snapshots) >= 3, timeout=10)
    snap = snapshots[-1]
    assert snap.gpu_count == 8
    assert sorted(snap.states) == list(range(8))
    assert sorted(snap.power) == list(range(8))
    assert all(s.watts is not None for s in snap.power.values())
    assert all(i is not None for i in snap.identities)
    with pytest.raises(AttributeError):
        snap.time = 0  # frozen


def test_power_loop_holds_its_rate_and_timestamps_each_sample(running_sampler):
    sampler, _ = running_sampler
    time.sleep(2.5)
    stats = sampler.power_loop.stats()
    assert stats.achieved_hertz == pytest.approx(20, rel=0.05)
    times, watts, _ = sampler.buffer.window(2.0)
    assert watts.shape[0] == 8 and watts.shape[1] >= 35
    steps = np.diff(times[0])
    assert np.median(steps) == pytest.approx(0.05, rel=0.2)


HANG_ON_GPU_1 = """
gpus: 4
events:
  - {kind: hang, at: 0, gpu: 1, call: nvmlDeviceGetTemperature, seconds: 30}
"""


def test_a_call_hung_at_start_up_only_delays_the_first_snapshot():
    snapshots = []
    with fake.installed(scenario_from_yaml(HANG_ON_GPU_1)) as lib:
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake"),
                          on_snapshot=snapshots.append)
        t0 = time.monotonic()
        sampler.start()
        try:
            assert time.monotonic() - t0 < 4
            assert {0, 2, 3} <= set(snapshots[-1].power)  # the power loop is not stuck
            # once the call has hung for the timeout, the sweep goes on without GPU 1
            wait_for(lambda: 1 in snapshots[-1].hung, timeout=5)
            wait_for(lambda: sorted(snapshots[-1].states) == [0, 2, 3], timeout=5)
            snap = snapshots[-1]
            assert not snap.up(1) and snap.up(0) and snap.up(3)
            assert 1 not in snap.power  # a hung GPU's stale values are left out
            assert snap.sweep_loop.restarts_total == 1
            assert snap.hangs == {1: 1}
        finally:
            lib.release_hangs()
            sampler.stop()


HANG_LATER = """
gpus: 4
events:
  - {kind: hang, at: 2, gpu: 1, call: nvmlDeviceGetTemperature, seconds: 30}
"""


def test_a_hung_gpu_is_isolated_and_comes_back_when_its_call_returns():
    snapshots = []
    with fake.installed(scenario_from_yaml(HANG_LATER)) as lib:
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake"),
                          on_snapshot=snapshots.append)
        sampler.start()
        try:
            wait_for(lambda: sampler.sweep_loop.busy == "gpu 1", timeout=10, interval=0.01)
            count = len(snapshots)
            wait_for(lambda: 1 in snapshots[-1].hung, timeout=5)
            assert len(snapshots) >= count + 2  # publishing never stopped
            before = snapshots[-1].states[2].time
            wait_for(lambda: snapshots[-1].states[2].time > before, timeout=5)  # others flow
            snap = snapshots[-1]
            assert time.time() - snap.hung[1] >= 2.0
            assert snap.power_loop.achieved_hertz > 15  # power sampling is unaffected
            lib.release_hangs()  # the stuck call returns: GPU 1 is read again
            wait_for(lambda: 1 not in snapshots[-1].hung and 1 in snapshots[-1].states,
                     timeout=5)
        finally:
            lib.release_hangs()
            sampler.stop()


class _Broken:
    name = "broken"

    def read(self):
        raise OSError("boom")


class _Fine:
    name = "fine"

    def read(self):
        return {"ok": 1}


def test_a_failing_source_is_reported_not_fatal():
    with fake.installed(load_scenario("idle")):
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake"),
                          sources=[_Broken(), _Fine()])
        sampler.start()
        try:
            snap = sampler.snapshot
            assert sorted(snap.sources) == ["broken", "fine"]
            assert snap.sources["broken"].success is False
            assert snap.sources["broken"].errors_total == 1
            assert "boom" in snap.sources["broken"].error
            assert snap.sources["fine"].success is True
            assert snap.sources["fine"].reading == {"ok": 1}
        finally:
            sampler.stop()


class _WantsGpuCount:
    name = "counted"

    def __init__(self):
        self.count = None

    def set_gpu_count(self, count):
        self.count = count

    def read(self):
        assert self.count is not None, "read before set_gpu_count"
        return self.count


def test_sources_that_want_the_gpu_count_get_it_before_the_first_read():
    source = _WantsGpuCount()
    with fake.installed(load_scenario("idle")):
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake"), sources=[source])
        sampler.start()
        try:
            result = sampler.snapshot.sources["counted"]
            assert result.success and result.reading == sampler.gpu_count > 0
        finally:
            sampler.stop()
