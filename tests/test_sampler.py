"""Sampler: power at the sensor's native rate, buffers bounded, every cadence on time,
faults never stop publishing. Most tests run in simulated time (Sampler.advance on a
manual clock); the hang tests use real threads, since that is what they test."""

from __future__ import annotations

import dataclasses
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

from exporter.gpu.backend import NvmlBackend
from exporter.metrics.render import render
from exporter.sampling.buffers import PowerBuffer
from exporter.sampling.clock import ManualClock
from exporter.sampling.loops import Loop, Together
from exporter.sampling.sampler import (
    COLLECTOR_PHASES,
    PHASES,
    CollectorMaker,
    Sampler,
    SamplerSettings,
)
from exporter.sim import fake
from exporter.sim.scenarios import load_scenario
from tests.tools import scenario_from_yaml, wait_for


@contextmanager
def simulated(scenario, **settings):
    """A sampler on the fake, ticked by hand on a manual clock (no threads)."""
    clock = ManualClock()
    with fake.installed(scenario, clock, costs=None) as lib:
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake", **settings),
                          clock=clock)
        sampler.start(threads=False)
        try:
            yield sampler, lib, clock
        finally:
            sampler.stop()


def test_power_buffer_is_bounded_and_windows_by_time():
    buf = PowerBuffer(gpus=2, capacity=10)
    buf.append(0, np.arange(1000.0, 1025.0), np.arange(25.0))
    assert buf.count == [25, 0]
    times, watts = buf.window(0, 1e9)
    assert list(watts) == [float(i) for i in range(15, 25)]  # only the newest 10 are kept
    times, _ = buf.window(0, 3.0)
    assert list(times) == [1022.0, 1023.0, 1024.0]
    assert len(buf.window(1, 10)[0]) == 0
    nbytes = buf.nbytes
    buf.append(1, np.arange(2000.0, 3000.0), np.ones(1000))  # more than the capacity at once
    assert buf.nbytes == nbytes
    assert list(buf.window(1, 1e9)[0]) == [float(t) for t in range(2990, 3000)]


@pytest.mark.parametrize("written", [7, 10, 13, 25, 31])
def test_power_buffer_window_is_exact_wherever_the_ring_wraps(written):
    buf = PowerBuffer(gpus=1, capacity=10)
    for start in range(0, written, 3):  # batches of 3, as drains arrive
        t = np.arange(start, min(start + 3, written), dtype=float)
        buf.append(0, t, t * 10)
    held = np.arange(max(0, written - 10), written, dtype=float)
    for seconds in (0.5, 1.0, 2.5, 4.0, 9.0, 100.0):
        for end in (None, written - 1.0, written - 3.5, held[0], held[0] - 1):
            e = held[-1] if end is None else end
            want = held[(held > e - seconds) & (held <= e)]
            times, watts = buf.window(0, seconds, end)
            assert list(times) == list(want) and list(watts) == list(want * 10)


def test_power_buffer_drops_samples_not_newer_than_its_newest():
    buf = PowerBuffer(gpus=1, capacity=10)
    buf.append(0, np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0]))
    buf.append(0, np.array([2.5, 3.0, 4.0]), np.array([9.0, 9.0, 4.0]))  # clock stepped back
    times, watts = buf.window(0, 100)
    assert list(times) == [1.0, 2.0, 3.0, 4.0] and list(watts) == [1.0, 2.0, 3.0, 4.0]
    buf.append(0, np.array([0.5]), np.array([7.0]))  # nothing newer: nothing written
    assert buf.count == [4]


def test_power_buffer_grid_aligns_gpus_and_leaves_holes_empty():
    buf = PowerBuffer(gpus=2, capacity=1000)
    t = np.arange(0.0, 10.0, 0.02)
    buf.append(0, t, 100 + 10 * np.sin(t))
    keep = (t < 4) | (t > 6)  # GPU 1 has a 2 s hole
    buf.append(1, t[keep], np.full(keep.sum(), 50.0))
    grid, watts = buf.grid(8.0, 0.1)
    assert watts.shape == (2, len(grid)) and grid[-1] == pytest.approx(t[-1])
    assert np.allclose(watts[0], 100 + 10 * np.sin(grid), atol=0.05)
    hole, clear = (grid > 4.05) & (grid < 5.95), (grid < 3.9) | (grid > 6.1)
    assert np.isnan(watts[1][hole]).all() and not np.isnan(watts[1][clear]).any()


def test_power_comes_from_the_driver_buffer_at_its_native_rate():
    with simulated(load_scenario("training")) as (sampler, _, clock):
        sampler.advance(10)
        snap = sampler.snapshot
        assert snap.gpu_count == 8 and sorted(snap.power) == list(range(8))
        for stats in snap.power_sampling.values():
            assert stats.kind == "buffer" and stats.lost_total == 0
            assert stats.sample_interval_seconds == pytest.approx(0.02, rel=0.1)
            assert stats.samples_total >= 10 * 45  # >= 40 samples/s per GPU
        assert snap.observable_band_hz[1] >= 20
        times, watts = snap.power_ring.window(3, 5.0)
        assert np.all(np.diff(times) > 0)  # in order, no duplicates
        assert watts.max() > 600 and watts.min() < 260  # the step swing, sample by sample
        # the snapshot's view ends where the snapshot was taken: later drains never show
        ring = snap.power_ring
        assert ring is not None and ring.end is not None and ring.end >= times[-1]
        before = ring.window(3, 5.0)[0]
        sampler.advance(2)
        assert sampler.snapshot.power_ring.end > ring.end
        assert np.array_equal(ring.window(3, 5.0)[0], before)
        assert sampler.loop("power").period == 1.0  # one drain a second


def test_a_snapshot_cannot_be_changed_by_whoever_reads_it():
    with simulated(load_scenario("training")) as (sampler, _, clock):
        sampler.advance(3)
        snap = sampler.snapshot
        with pytest.raises(dataclasses.FrozenInstanceError):
            snap.time = 0.0  # type: ignore[misc]
        for name in ("readings", "power", "power_sampling", "loops", "device_reads", "collectors"):
            with pytest.raises(TypeError):
                getattr(snap, name)[0] = None  # a read-only view, not the dict itself
        states = dict(snap.readings)
        sampler.advance(2)  # the sampler goes on; what the snapshot holds does not
        assert dict(snap.readings) == states and sampler.snapshot is not snap


def test_a_late_drain_counts_the_samples_it_lost():
    with simulated(load_scenario("training")) as (sampler, _, clock):
        sampler.advance(3)
        clock.advance(5)  # the exporter was starved for 5 s: the buffer holds 2.4 s
        sampler.advance(2)
        stats = sampler.snapshot.power_sampling[0]
        assert stats.lost_total == pytest.approx(130, abs=30)  # ~2.6 s at 50/s
        assert stats.gap_seconds_total == pytest.approx(2.6, abs=0.5)


NO_BUFFER = """
gpus: 2
device: {power_sample_buffer: 0}
"""


def test_without_a_buffer_the_instant_field_is_polled():
    with simulated(scenario_from_yaml(NO_BUFFER), power_sample_rate_hz=20) as (sampler, lib, _):
        sampler.advance(5)
        snap = sampler.snapshot
        assert {s.kind for s in snap.power_sampling.values()} == {"poll"}
        assert sampler.loop("power").period == pytest.approx(0.05)
        assert snap.power_sampling[0].samples_total >= 5 * 19
        assert snap.observable_band_hz[1] == pytest.approx(10)  # half of 20 Hz
        # asked once whether there is a buffer; NotSupported is not asked again
        assert lib.calls["nvmlDeviceGetSamples"] == 2


def test_energy_is_read_at_its_own_slow_interval():
    with simulated(load_scenario("training"), energy_interval_seconds=30) as (sampler, _, _):
        first = sampler.snapshot.readings[0].get("energy_joules")
        sampled_first = sampler.snapshot.power_sampling[0].sampled_energy_joules
        sampler.advance(20)
        assert sampler.snapshot.readings[0].get("energy_joules") == first  # not due yet
        sampler.advance(10)
        snap = sampler.snapshot
        driver = snap.readings[0].get("energy_joules") - first
        sampled = snap.power_sampling[0].sampled_energy_joules - sampled_first
        assert driver > 30 * 150
        # the driver's counter and the integral of the samples agree over the 30 s
        assert sampled == pytest.approx(driver, rel=0.02)


def test_snapshots_are_frozen_and_complete():
    with simulated(load_scenario("training")) as (sampler, _, _):
        sampler.advance(3)
        snap = sampler.snapshot
        assert sorted(snap.readings) == list(range(8))
        assert all(i is not None for i in snap.identities)
        with pytest.raises(AttributeError):
            snap.time = 0


class _Broken:
    name = "broken"

    def read(self):
        raise OSError("boom")


class _Fine:
    name = "fine"

    def read(self):
        return {"ok": 1}


def test_a_failing_collector_is_reported_not_fatal():
    clock = ManualClock()
    with fake.installed(load_scenario("idle"), clock, costs=None):
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake"),
                          collectors=[_Broken(), _Fine()], clock=clock)
        sampler.start(threads=False)
        try:
            snap = sampler.snapshot
            assert sorted(snap.collectors) == ["broken", "fine"]
            assert snap.collectors["broken"].success is False
            assert snap.collectors["broken"].errors_total == 1
            assert "boom" in snap.collectors["broken"].error
            assert snap.collectors["fine"].success is True
            assert snap.collectors["fine"].reading == {"ok": 1}
        finally:
            sampler.stop()


def test_collectors_are_built_with_the_gpu_count_before_the_first_read():
    seen = {}

    def make(context):
        seen["gpus"] = context.gpu_count
        return _Fine()

    clock = ManualClock()
    with fake.installed(load_scenario("idle"), clock, costs=None):
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake"),
                          collectors=[CollectorMaker("fine", 5.0, make)], clock=clock)
        sampler.start(threads=False)
        try:
            assert seen == {"gpus": 8}
            assert sampler.snapshot.collectors["fine"].success
        finally:
            sampler.stop()


# -- real threads: loops keep their schedule; hung calls are isolated -------------------

@contextmanager
def threaded(on_snapshot=None, collectors=None, **settings):
    """A sampler on the fake (training), in its threads, in real time."""
    with fake.installed(load_scenario("training"), costs=None):
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake", **settings),
                          collectors=collectors, on_snapshot=on_snapshot)
        sampler.start()
        try:
            yield sampler
        finally:
            sampler.stop()


def test_threads_publish_snapshots_with_all_gpus():
    snapshots = []
    with threaded(snapshots.append):
        wait_for(lambda: len(snapshots) >= 3, timeout=10)
    snap = snapshots[-1]
    assert sorted(snap.readings) == list(range(8)) and sorted(snap.power) == list(range(8))
    assert snap.power_sampling[0].samples_total >= 50


@pytest.mark.parametrize("base", [1.0, 0.5])
def test_loops_in_threads_of_their_own_tick_apart_from_the_sampling_slot(base):
    """Ticks that coincide fight for the GIL: a loop in a thread of its own (the readers'
    watch, the collectors) keeps its own slot in the sweep interval, apart from the
    sampling thread's, which the readers, the analyses and the snapshot share."""
    fine = CollectorMaker("fine", base, lambda context: _Fine())
    with threaded(collectors=[fine], sweep_interval_seconds=base) as sampler:
        names = ("power", "sweep", "publish", "power_watch", "fine")
        loops = {name: sampler.loop(name) for name in names}
        wait_for(lambda: all(loop.iterations >= 2 for loop in loops.values()), timeout=10)
        power = loops["power"].next_tick  # (power's slot is 0)
        slot = {name: (loop.next_tick - power) % base for name, loop in loops.items()}
    # (the threads start a few ms apart)
    assert slot["sweep"] == pytest.approx(0.0, abs=0.02)
    assert slot["publish"] == pytest.approx(0.0, abs=0.02)
    assert slot["power_watch"] == pytest.approx(PHASES["power_watch"] * base, abs=0.02)
    assert COLLECTOR_PHASES[0] * base - 0.02 <= slot["fine"] <= COLLECTOR_PHASES[1] * base + 0.02


def test_the_readers_analyses_and_snapshot_share_one_thread_in_order():
    """One wake-up a second for the power drain, the sweep, the analyses and the
    snapshot, in that order (the snapshot right after the straggler tick it publishes);
    the readers' watch and the collectors in threads of their own."""
    snapshots = []
    fine = CollectorMaker("fine", 1.0, lambda context: _Fine())
    with threaded(snapshots.append, collectors=[fine]) as sampler:
        names = ("power", "sweep", "analysis", "stragglers", "publish")
        loops = [sampler.loop(name) for name in names]
        wait_for(lambda: loops[3].iterations >= 2 and loops[4].iterations >= 4, timeout=15)
        apart = [sampler.loop("power_watch").thread,
                 *(r.loop.thread for r in sampler.collectors)]
        threads = {loop.thread for loop in loops}
        starts = {name: list(loop._starts) for name, loop in zip(names, loops, strict=True)}
    assert len(threads) == 1 and threads.pop().name == "cte-sampling"
    assert len(set(apart)) == len(apart) and not set(apart) & {loops[0].thread}
    # each tick after the one before it in the same wake-up (0.4 s leaves a tick room to
    # run long on a loaded machine; another wake-up would be a whole interval apart)
    for before, after in (("power", "sweep"), ("sweep", "stragglers"),
                          ("stragglers", "publish")):
        assert any(0 <= starts[after][-1] - tick < 0.4 for tick in starts[before])
    assert snapshots[-1].gpu_count == 8


def test_the_readers_watch_ticks_half_an_interval_after_the_sampling_slot():
    """The watch must run while a reader may be stuck, so in a thread of its own: half a
    sweep interval after the sampling thread's wake-up, time enough for a whole tick."""
    with threaded() as sampler:
        loops = {name: sampler.loop(name) for name in ("power", "power_watch")}
        wait_for(lambda: all(loop.iterations >= 2 for loop in loops.values()), timeout=10)
        slot = {name: loop.next_tick % 1.0 for name, loop in loops.items()}
        assert loops["power_watch"].thread is not loops["power"].thread
    after_power = (slot["power_watch"] - slot["power"]) % 1.0
    assert after_power == pytest.approx(PHASES["power_watch"], abs=0.02)


def test_the_xid_thread_waits_2_s_at_a_time_when_no_event_comes():
    """Each wake-up costs 100-300 us of CPU on a VM: a wait lasts 2 s, not 0.5 s. Counted
    as the driver sees them, calls to nvmlEventSetWait: the thread's context switches
    also count its waits for the GIL, which other threads' load decides."""
    with fake.installed(load_scenario("training"), costs=None) as lib:
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake"))
        sampler.start()
        try:
            wait_for(lambda: sampler.xids.events.registered == 8, timeout=5)
            before = lib.calls.get("nvmlEventSetWait_v2", 0)
            time.sleep(4.0)
            assert lib.calls.get("nvmlEventSetWait_v2", 0) - before <= 3  # at 0.5 s: 8
        finally:
            sampler.stop()


def test_a_loop_moves_onto_its_slot_after_its_first_tick():
    clock = ManualClock()
    t0 = clock.monotonic()
    loop = Loop("x", 1.0, lambda: None, threading.Event(), clock, slot=t0 + 0.3)
    starts = []
    for _ in range(4):
        clock.set(loop.next_tick if loop.next_tick is not None else t0 + 0.5)
        starts.append(clock.monotonic() - t0)
        loop.tick()
    assert starts == pytest.approx([0.5, 2.3, 3.3, 4.3])  # never sooner than a period
    clock.set(t0 + 4.5)
    loop.next_tick = clock.monotonic()  # knocked off its slot, as a restart does
    loop.tick()
    assert loop.next_tick - t0 == pytest.approx(6.3)  # back on it, a period or more on
    fast = Loop("y", 0.25, lambda: None, threading.Event(), clock, slot=t0 + 0.4)
    fast.tick()
    assert fast.next_tick == pytest.approx(t0 + 4.9)  # 4.5 + 0.25, onto 0.4 + k / 4


HANG_ON_GPU_1 = """
gpus: 4
events:
  - {kind: hang, at: 0, gpu: 1, call: nvmlDeviceGetTemperature, seconds: 30}
"""


# Hang tests: a GPU is declared hung after 0.5 s (not 2 s) and sweeps come every 0.25 s,
# so each runs in about a second; what they check does not depend on those numbers.
FAST_HANGS = {"hang_timeout_seconds": 0.5, "sweep_interval_seconds": 0.25,
              "startup_wait_seconds": 0.5}


def test_a_call_hung_at_start_up_only_delays_the_first_snapshot():
    snapshots = []
    with fake.installed(scenario_from_yaml(HANG_ON_GPU_1), costs=None) as lib:
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake", **FAST_HANGS),
                          on_snapshot=snapshots.append)
        t0 = time.monotonic()
        sampler.start()
        try:
            # the 30 s hang delays start by the start-up wait (0.5 s), not by itself
            assert time.monotonic() - t0 < 10
            assert {0, 2, 3} <= set(snapshots[-1].power)  # the power loop is not stuck
            # once the call has hung for the timeout, the sweep goes on without GPU 1
            wait_for(lambda: 1 in snapshots[-1].hung, timeout=5)
            wait_for(lambda: sorted(snapshots[-1].readings) == [0, 2, 3], timeout=5)
            snap = snapshots[-1]
            assert not snap.up(1) and snap.up(0) and snap.up(3)
            assert 1 not in snap.power  # a hung GPU's stale values are left out
            assert snap.loops["sweep"].restarts_total == 1
            assert snap.hangs == {1: 1}
        finally:
            lib.release_hangs()
            sampler.stop()


HANG_LATER = """
gpus: 4
events:
  - {kind: hang, at: 1, gpu: 1, call: nvmlDeviceGetTemperature, seconds: 30}
"""


def test_a_hung_gpu_is_isolated_and_comes_back_when_its_call_returns():
    snapshots = []
    settings = SamplerSettings(backend="fake", power_drain_interval_seconds=0.25, **FAST_HANGS)
    with fake.installed(scenario_from_yaml(HANG_LATER), costs=None) as lib:
        sampler = Sampler(NvmlBackend(), settings, on_snapshot=snapshots.append)
        sampler.start()
        try:
            wait_for(lambda: sampler.loop("sweep").busy_gpu == 1, timeout=10,
                     interval=0.01)
            count = len(snapshots)
            wait_for(lambda: 1 in snapshots[-1].hung, timeout=5)
            assert len(snapshots) >= count + 2  # publishing never stopped
            before = snapshots[-1].readings[2].time
            wait_for(lambda: snapshots[-1].readings[2].time > before, timeout=5)  # others flow
            snap = snapshots[-1]
            assert time.time() - snap.hung[1] >= settings.hang_timeout_seconds
            samples = snap.power_sampling[0].samples_total
            wait_for(lambda: snapshots[-1].power_sampling[0].samples_total > samples + 40,
                     timeout=5)  # power sampling is unaffected
            lib.release_hangs()  # the stuck call returns: GPU 1 is read again
            wait_for(lambda: 1 not in snapshots[-1].hung and 1 in snapshots[-1].readings,
                     timeout=5)
        finally:
            lib.release_hangs()
            sampler.stop()


def test_loops_sharing_a_thread_go_on_together_when_one_is_left_stuck():
    """Superseding a loop that shares its thread takes the others into the fresh thread:
    they keep their schedule there, and the stuck thread exits when its call returns
    without ticking anything again (no loop runs in two threads)."""
    stop, release = threading.Event(), threading.Event()
    calls = {"stuck": 0, "steady": 0}

    def stuck():
        calls["stuck"] += 1
        if calls["stuck"] == 2:
            stuck_loop.enter(0)
            release.wait(30)  # a call that hangs until released
            stuck_loop.leave()

    def steady():
        calls["steady"] += 1

    stuck_loop = Loop("stuck", 0.1, stuck, stop)
    steady_loop = Loop("steady", 0.1, steady, stop)
    together = Together([stuck_loop, steady_loop], "pair")
    old = together.start()
    try:
        wait_for(lambda: stuck_loop.busy_gpu == 0, timeout=5, interval=0.01)
        before = calls["steady"]
        time.sleep(0.3)
        assert calls["steady"] == before  # held up with it
        stuck_loop.restart()
        fresh = stuck_loop.thread
        assert fresh is steady_loop.thread is together.thread and fresh is not old
        wait_for(lambda: calls["steady"] >= before + 5, timeout=5)  # going on
        assert stuck_loop.iterations >= 1 and stuck_loop.restarts == 1
        release.set()
        old.join(5)
        assert not old.is_alive() and fresh.is_alive()
        ticks = steady_loop.iterations
        time.sleep(1.0)
        # one thread at 0.1 s: ~10 ticks in a second, not twice that
        assert 5 <= steady_loop.iterations - ticks <= 13
    finally:
        release.set()
        stop.set()
        together.thread.join(5)


def test_a_sweep_stuck_in_one_gpu_holds_up_neither_the_power_drain_nor_the_snapshot():
    """The sweep shares its thread with the power drain and the snapshot: stuck in GPU 1's
    call, it is left behind by the readers' watch long before the hang timeout, and the
    others' power is drained on time (none of their samples lost) while snapshots go on."""
    snapshots = []
    settings = SamplerSettings(backend="fake", hang_timeout_seconds=30.0,
                               startup_wait_seconds=0.5)
    with fake.installed(scenario_from_yaml(HANG_LATER), costs=None) as lib:
        sampler = Sampler(NvmlBackend(), settings, on_snapshot=snapshots.append)
        sampler.start()
        try:
            sweep = sampler.loop("sweep")
            wait_for(lambda: sweep.busy_gpu == 1, timeout=10, interval=0.01)
            stuck_at = time.monotonic()
            wait_for(lambda: sweep.restarts == 1, timeout=5, interval=0.01)
            assert time.monotonic() - stuck_at < 5.0  # the watch, not the 30 s timeout
            count = len(snapshots)
            samples = snapshots[-1].power_sampling[0].samples_total
            wait_for(lambda: len(snapshots) >= count + 3, timeout=10)  # publishing goes on
            snap = snapshots[-1]
            assert snap.power_sampling[0].samples_total > samples + 50  # a second's worth
            assert all(snap.power_sampling[g].lost_total == 0 for g in (0, 2, 3))
            assert not snap.hung  # stuck, not yet hung: that waits for the timeout
            assert sorted(snap.readings) == [0, 1, 2, 3]  # its last reading still served
        finally:
            lib.release_hangs()
            sampler.stop()


class _Counting:
    name = "counting"

    def __init__(self):
        self.reads = 0

    def read(self):
        self.reads += 1
        return self.reads


class _Stuck:
    """A read that blocks (a hung driver file), until released."""

    name = "stuck"

    def __init__(self):
        self.release = threading.Event()

    def read(self):
        self.release.wait(60)
        return "late"


def test_a_stuck_collector_stalls_only_itself_and_says_so():
    stuck, counting = _Stuck(), _Counting()
    snapshots = []
    with fake.installed(load_scenario("idle"), costs=None):
        sampler = Sampler(NvmlBackend(), SamplerSettings(
            backend="fake", sources_interval_seconds=0.2, hang_timeout_seconds=0.5,
            sweep_interval_seconds=0.25, startup_wait_seconds=0.5),
            collectors=[CollectorMaker("stuck", 0.2, lambda c: stuck),
                        CollectorMaker("counting", 0.2, lambda c: counting)],
            on_snapshot=snapshots.append)
        sampler.start()
        try:
            def stuck_now():
                snap = sampler.build_snapshot()
                return snap.collectors["stuck"].stuck_seconds > 0 and snap
            snap = wait_for(stuck_now, timeout=10)
            result = snap.collectors["stuck"]
            assert not result.success and "stuck" in result.error
            reads = counting.reads
            wait_for(lambda: counting.reads >= reads + 3, timeout=5)  # the others go on
            assert sampler.build_snapshot().collectors["counting"].success
            assert 'cte_source_stuck_seconds{source="stuck"}' in render(snap).decode()
            stuck.release.set()
            wait_for(lambda: sampler.build_snapshot().collectors["stuck"].success, timeout=5)
        finally:
            stuck.release.set()
            sampler.stop()
