"""The power loop: every GPU's samples at the sensor's native rate into the PowerBuffer.

Each GPU has a reader (gpu/power_reader.py): the driver's sample buffer, drained every
`--power.drain-interval`, or where there is none, the instant field polled at
`--power.sample-rate`. The loop ticks at the faster of the two and each reader reads
when it is due. The samples keep the driver's timestamps, so the loop's own jitter never
reaches the waveform.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from exporter.gpu.power_reader import (
    POLL,
    BufferDrain,
    FieldPoll,
    detect_update_period,
    power_reader,
)
from exporter.sampling.buffers import PowerBuffer
from exporter.sampling.clock import Clock
from exporter.sampling.gpus import GpuSet
from exporter.sampling.loops import Loop
from exporter.sampling.snapshot import PowerReading, PowerSamplingStats

log = logging.getLogger(__name__)

# Ring capacity per GPU and second the ring spans: above the buffer's ~55 samples/s.
SAMPLES_PER_SECOND_KEPT = 64


class PowerSampler:
    def __init__(self, gpus: GpuSet, clock: Clock, drain_interval: float, poll_hertz: float,
                 ring_seconds: float):
        self.gpus, self.clock = gpus, clock
        self.drain_interval, self.poll_hertz = drain_interval, poll_hertz
        self.ring_seconds = ring_seconds
        self.readers: dict[int, BufferDrain | FieldPoll] = {}
        self.buffer: PowerBuffer | None = None
        self.latest: dict[int, PowerReading] = {}
        self.energy: dict[int, float] = {}  # the samples integrated (joules)
        self.update_periods: dict[int, float] = {}  # polled GPUs' sensor update period
        self._due: dict[int, float] = {}
        self.recorder: Callable[[int, np.ndarray, np.ndarray], None] | None = None

    def start(self) -> None:
        for gpu in range(self.gpus.count):
            self.reset(gpu)
        rate = max(SAMPLES_PER_SECOND_KEPT, self.poll_hertz if self.polled() else 0)
        self.buffer = PowerBuffer(self.gpus.count, max(16, int(rate * self.ring_seconds)),
                                  self.ring_seconds)
        if self.polled():
            self.update_periods = detect_update_period(self.gpus.backend, self.polled())

    def reset(self, gpu: int) -> None:
        """A fresh reader (at start, and when a lost GPU comes back)."""
        if self.gpus.readable(gpu) and self.gpus.backend.handle(gpu) is not None:
            self.readers[gpu] = power_reader(self.gpus.backend, gpu, self.clock.time)
            self._due[gpu] = 0.0

    def polled(self) -> list[int]:
        return [gpu for gpu, r in self.readers.items() if r.kind == POLL]

    @property
    def period(self) -> float:
        """The loop's tick: the drain interval, or the polling period if any GPU polls."""
        return min(self.drain_interval, 1.0 / self.poll_hertz) if self.polled() else (
            self.drain_interval)

    def tick(self, loop: Loop) -> None:
        now = self.clock.monotonic()
        half_tick = 0.5 * self.period  # once a tick, not once a GPU (it lists the polled)

        def read(gpu: int) -> None:
            reader = self.readers.get(gpu)
            if reader is None or now < self._due.get(gpu, 0.0):
                return
            # due again one interval on, less half a tick so schedule jitter never skips one
            interval = self.drain_interval if reader.kind != POLL else 0.0
            self._due[gpu] = now + interval - half_tick
            new = reader.read()
            if new is not None and len(new.times):
                self._store(gpu, new.times, new.watts, new.micros)

        self.gpus.each(loop, read)

    def _store(self, gpu: int, times: np.ndarray, watts: np.ndarray,
               micros: np.ndarray | None = None) -> None:
        last = self.latest.get(gpu)
        joules = float(np.dot(watts[1:] + watts[:-1], times[1:] - times[:-1])) / 2  # trapezoids
        if last is not None:  # and the one from the previous sample on
            joules += (last.watts + float(watts[0])) / 2 * (float(times[0]) - last.time)
        self.energy[gpu] = self.energy.get(gpu, 0.0) + joules
        self.latest[gpu] = PowerReading(float(times[-1]), float(watts[-1]))
        if self.buffer is not None:
            self.buffer.append(gpu, times, watts, micros)
        if self.recorder is not None:
            self.recorder(gpu, times, watts)

    def interval(self, gpu: int) -> float | None:
        """The GPU's effective sample interval: the buffer's median interval, or for a
        polled GPU the slower of polling and the sensor's update period."""
        reader = self.readers.get(gpu)
        if reader is None:
            return None
        median = reader.intervals.median
        if reader.kind != POLL:
            return median
        return max(1.0 / self.poll_hertz, self.update_periods.get(gpu, 0.0))

    def band(self) -> tuple[float, float]:
        """0 to half the effective sample rate of the slowest GPU (0, 0 until known)."""
        intervals = [i for g in self.readers if (i := self.interval(g))]
        return (0.0, 0.5 / max(intervals)) if intervals else (0.0, 0.0)

    def stats(self) -> dict[int, PowerSamplingStats]:
        return {gpu: PowerSamplingStats(
            r.kind, self.interval(gpu), r.samples_total, r.lost_total, r.gap_seconds_total,
            self.energy.get(gpu, 0.0)) for gpu, r in self.readers.items()}
