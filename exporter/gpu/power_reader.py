"""Power at the sensor's native rate, per GPU: the driver's buffer of power samples, or
polling the instant-power field where the driver keeps no such buffer.

On an H200 the driver buffers ~55 power samples a second (median 20 ms apart, each with
its own CPU timestamp in microseconds) in a buffer of 119 samples (~2.4 s), and one
`nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES, last_seen)` call per second returns the
new ones for 0.3-0.5 ms; the instant field (186) changes only every ~100 ms. So a drain
every second sees everything the sensor gives at a twentieth of the cost of polling
(docs/nvml-costs.md). A drain that comes too late finds the oldest samples gone: the gap is
counted, never hidden.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from exporter.gpu import fields as fi
from exporter.gpu.backend import NvmlBackend

log = logging.getLogger(__name__)

BUFFER, POLL = "buffer", "poll"
# Driver timestamps further than this from the clock are not epoch-based: re-based once.
_EPOCH_TOLERANCE = 3600.0
# Whole microseconds up to this convert to float64 exactly (2**53)
_EXACT_MICROS = 2**53


def _median(x: np.ndarray) -> float:
    """np.median of finite values, the same value: np.median asks numpy.ma whether its
    input is masked, which imports numpy.ma (~1 MiB) into the exporter."""
    ordered = np.sort(x)
    half = ordered.size // 2
    return float(ordered[half] if ordered.size % 2 else (ordered[half - 1] + ordered[half]) / 2)

@dataclass(frozen=True)
class NewSamples:
    times: np.ndarray  # epoch seconds, increasing
    watts: np.ndarray
    # the driver's whole microseconds where times are exactly micros / 1e6 (not re-based):
    # the power ring holds them as they are, without working them out from times again
    micros: np.ndarray | None = None


_EMPTY = NewSamples(np.zeros(0), np.zeros(0))


class _Intervals:
    """The median interval between recent samples (computed once per batch of samples,
    not each time it is asked)."""

    def __init__(self, keep: int = 512, every: int = 256):
        self._recent = np.zeros(keep)
        self._count = 0  # intervals ever added
        self._every = every  # recompute the median after this many new intervals
        self._at = 0
        self.median: float | None = None

    def add(self, times: np.ndarray, previous: float | None) -> None:
        keep = len(self._recent)
        if previous is not None and len(times):
            new = np.empty(len(times))
            new[0] = times[0] - previous
            np.subtract(times[1:], times[:-1], out=new[1:])
        else:
            new = times[1:] - times[:-1]
        new = new[-keep:]
        start = self._count % keep
        head = min(len(new), keep - start)  # the ring's slots up to its end, then from 0
        self._recent[start:start + head] = new[:head]
        self._recent[:len(new) - head] = new[head:]
        self._count += len(new)
        filled = min(self._count, len(self._recent))
        if filled >= 3 and (self.median is None or self._count - self._at >= self._every
                            or filled < self._every):
            self.median = _median(self._recent[:filled])
            self._at = self._count


class BufferDrain:
    """Drains one GPU's buffer of power samples: everything newer than the last seen."""

    kind = BUFFER

    def __init__(self, backend: NvmlBackend, gpu: int, clock=time.time):
        self.backend, self.gpu, self.clock = backend, gpu, clock
        self.last_seen_us = 0
        self.offset = 0.0  # seconds to add to driver timestamps to get epoch time
        self._rebased = False
        self.intervals = _Intervals()
        self.capacity_seen = 0  # most samples one drain returned
        self.samples_total = 0
        self.lost_total = 0
        self.gap_seconds_total = 0.0

    def read(self) -> NewSamples | None:
        """The new samples; None when the call failed (counted by the backend)."""
        got = self.backend.samples(self.gpu, fi.TOTAL_POWER_SAMPLES, self.last_seen_us)
        if got is None:
            return None
        stamps_us, milliwatts = got  # oldest first
        if len(stamps_us) > 1 and not (stamps_us[1:] > stamps_us[:-1]).all():
            # each timestamp once, whatever the driver repeated
            stamps_us, first = np.unique(stamps_us, return_index=True)
            milliwatts = milliwatts[first]
        start = int(stamps_us.searchsorted(self.last_seen_us, side="right"))
        if start == len(stamps_us):  # nothing newer than what we have (dedupe by timestamp)
            return _EMPTY
        micros = stamps_us[start:]
        stamps, watts = micros.astype(float), milliwatts[start:] / 1000.0
        self.capacity_seen = max(self.capacity_seen, len(stamps))
        if not self._rebased:
            self._rebase(stamps[-1] / 1e6)
        times = stamps / 1e6
        if self.offset:  # adding 0.0 changes no time: only a re-based clock pays for it
            times += self.offset
        previous = self.last_seen_us / 1e6 + self.offset if self.last_seen_us else None
        self._count_gap(times, previous)
        self.intervals.add(times, previous)
        self.last_seen_us = int(stamps[-1])
        self.samples_total += len(times)
        return NewSamples(times, watts, None if self.offset or micros[-1] >= _EXACT_MICROS
                          else micros)

    def _rebase(self, newest: float) -> None:
        now = self.clock()
        if abs(now - newest) > _EPOCH_TOLERANCE:
            self.offset = now - newest
            log.info("GPU %d: power sample timestamps are not epoch-based; re-based by "
                     "%.0f s", self.gpu, self.offset)
        self._rebased = True

    def _count_gap(self, times: np.ndarray, previous: float | None) -> None:
        """Samples the buffer dropped before this drain: the hole before the first new one."""
        interval = self.intervals.median
        if previous is None or interval is None:
            return
        gap = times[0] - previous
        if gap > max(4 * interval, 0.2):
            lost = max(1, int(round(gap / interval)) - 1)
            self.lost_total += lost
            self.gap_seconds_total += gap - interval
            log.warning("GPU %d: %d power samples (%.2f s) were gone from the driver's "
                        "buffer before the drain", self.gpu, lost, gap - interval)


class FieldPoll:
    """Polls one GPU's instant-power field (for drivers without a sample buffer)."""

    kind = POLL

    def __init__(self, backend: NvmlBackend, gpu: int, clock=time.time):
        self.backend, self.gpu, self.clock = backend, gpu, clock
        self.intervals = _Intervals()
        self.last_time: float | None = None
        self.samples_total = 0
        self.lost_total = 0
        self.gap_seconds_total = 0.0
        self.capacity_seen = 0

    def read(self) -> NewSamples | None:
        milliwatts = self.backend.fields(self.gpu, [fi.POWER_INSTANT]).get(fi.POWER_INSTANT)
        if milliwatts is None:
            return None
        now = self.clock()
        times = np.array([now])
        self.intervals.add(times, self.last_time)
        self.last_time = now
        self.samples_total += 1
        return NewSamples(times, np.array([milliwatts / 1000.0]))


def power_reader(backend: NvmlBackend, gpu: int, clock=time.time) -> BufferDrain | FieldPoll:
    """The buffer where the driver keeps one for this GPU, else the polled field."""
    if backend.samples(gpu, fi.TOTAL_POWER_SAMPLES, 0) is not None:
        return BufferDrain(backend, gpu, clock)
    log.info("GPU %d: no buffer of power samples (nvmlDeviceGetSamples); polling the "
             "instant-power field", gpu)
    return FieldPoll(backend, gpu, clock)


def detect_update_period(backend: NvmlBackend, gpus: list[int], seconds: float = 0.5
                         ) -> dict[int, float]:
    """Poll the instant-power field of these GPUs as fast as possible; the typical
    interval between changes (as Zeus measures the sensor at start)."""
    changes: dict[int, list[float]] = {g: [] for g in gpus}
    last: dict[int, float | None] = {g: None for g in gpus}
    end = time.perf_counter() + seconds
    while gpus and time.perf_counter() < end:
        for gpu in gpus:
            if gpu in backend.lost:
                continue
            value = backend.fields(gpu, [fi.POWER_INSTANT]).get(fi.POWER_INSTANT)
            if value is None:
                continue
            if value != last[gpu]:
                if last[gpu] is not None:
                    changes[gpu].append(time.perf_counter())
                last[gpu] = value
    return {gpu: _median(np.diff(t)) for gpu, t in changes.items() if len(t) >= 4}
