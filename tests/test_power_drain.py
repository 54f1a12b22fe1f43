"""The drain of one GPU's power-sample buffer, against a scripted driver answer."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.gpu.power_reader import BufferDrain


class _Driver:
    """Answers nvmlDeviceGetSamples with the batches given, one per drain."""

    def __init__(self, *batches):
        self.batches = list(batches)

    def samples(self, gpu, sampling_type, last_seen_us):
        stamps, watts = self.batches.pop(0)
        return np.array(stamps, dtype=np.uint64), np.array(watts, dtype=float) * 1000


T0 = 1_700_000_000_000_000  # epoch microseconds


def _drain(*batches):
    return BufferDrain(_Driver(*batches), 0, clock=lambda: T0 / 1e6)


def test_samples_in_any_order_come_out_in_time_order_once_each():
    stamps = [T0 + 40_000, T0, T0 + 20_000, T0 + 20_000, T0 + 60_000]
    drain = _drain((stamps, [3, 1, 2, 2, 4]))
    new = drain.read()
    assert list(new.watts) == [1, 2, 3, 4]
    assert list(np.diff(new.times)) == pytest.approx([0.02] * 3)
    assert drain.last_seen_us == T0 + 60_000 and drain.samples_total == 4


def test_a_drain_hands_its_microseconds_on_only_where_times_are_made_of_them_alone():
    """The ring takes the driver's microseconds as they are (no rounding of the times back):
    the times are exactly them / 1e6; a re-based clock's times are not, and hand none."""
    stamps = [T0 + 20_000 * k for k in range(5)]
    new = _drain((stamps, [1] * 5)).read()
    assert new.micros is not None and new.micros.tolist() == stamps
    assert np.array_equal(new.micros / 1e6, new.times)
    boot = [20_000 * k + 7 for k in range(1, 6)]  # microseconds since boot
    rebased = _drain((boot, [1] * 5))
    new = rebased.read()
    assert rebased.offset and new.micros is None
    assert new.times[-1] == pytest.approx(T0 / 1e6)


def test_a_drain_repeating_what_was_seen_adds_nothing():
    first = ([T0 + 20_000 * k for k in range(5)], [1] * 5)
    drain = _drain(first, first, ([T0 + 20_000 * k for k in range(3, 8)], list(range(5))))
    drain.read()
    assert len(drain.read().times) == 0
    assert list(drain.read().watts) == [2, 3, 4]
    assert drain.samples_total == 8 and drain.lost_total == 0


def test_a_late_drain_counts_what_the_buffer_dropped():
    every = 20_000
    batches = [([T0 + every * k for k in range(50 * s, 50 * (s + 1))], [100] * 50)
               for s in range(3)]
    late = [T0 + every * k for k in range(250, 300)]  # samples 150-249 were gone
    drain = _drain(*batches, (late, [100] * 50))
    for _ in range(4):
        drain.read()
    assert drain.intervals.median == pytest.approx(0.02)
    assert drain.lost_total == 100
    assert drain.gap_seconds_total == pytest.approx(2.0)


def test_the_median_interval_is_of_the_latest_intervals_across_the_ring():
    """The ring of recent intervals wraps: its median is always that of the last `keep`."""
    from exporter.gpu.power_reader import _Intervals

    rng = np.random.default_rng(7)
    intervals = _Intervals(keep=16, every=1)
    everything: list[float] = []
    previous = None
    t = 100.0
    for size in [5, 11, 3, 16, 40, 1, 7, 9]:  # batches that end anywhere in the ring
        times = t + np.cumsum(rng.uniform(0.01, 0.05, size))
        everything += list(np.diff(times, prepend=previous if previous is not None else t))[
            (0 if previous is not None else 1):]
        intervals.add(times, previous)
        previous, t = float(times[-1]), float(times[-1])
        assert intervals.median == pytest.approx(float(np.median(everything[-16:])))


def _driver_with(stamps: list[int]):
    """pynvml with nvmlDeviceGetSamples answering from `stamps` (values: stamp / 1000),
    at most as many as the caller's count, oldest first; NotFound when none is newer."""
    import types

    import pynvml

    def get_samples(handle, sampling_type, last_seen, value_type, count, array):
        new = [s for s in stamps if s > last_seen.value][:count._obj.value]
        if not new:
            return pynvml.NVML_ERROR_NOT_FOUND
        for i, s in enumerate(new):
            array[i].timeStamp, array[i].sampleValue.ullVal = s, s // 1000
        value_type._obj.value = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        count._obj.value = len(new)
        return pynvml.NVML_SUCCESS

    calls = []

    def lookup(name):
        calls.append(name)
        return get_samples

    nvml = types.SimpleNamespace(**{k: getattr(pynvml, k) for k in dir(pynvml)
                                    if not k.startswith("__")})
    nvml._nvmlGetFunctionPointer = lookup
    return nvml, calls


@pytest.mark.parametrize("available", [10, 256, 700, 1024])
def test_a_drain_takes_everything_even_beyond_one_answer(available: int):
    from exporter.gpu.batched import SAMPLE_CAPACITY, SampleBuffer

    stamps = [1_000_000 + 1000 * i for i in range(available)]
    nvml, calls = _driver_with(stamps)
    got, values = SampleBuffer(nvml).read(nvml, None, 0, 0)
    assert got.tolist() == stamps  # all of them, in order, once each
    assert values.tolist() == [s // 1000 for s in stamps]
    # one call per full answer, and one more that finds the rest (or nothing)
    assert len(calls) == available // SAMPLE_CAPACITY + 1
