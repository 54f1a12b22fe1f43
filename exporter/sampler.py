"""The sampler owns the threads that read hardware; scrapes never do.

- power loop: instant power + energy of every GPU at a fixed rate (20 Hz),
  into bounded ring buffers;
- sweep loop: the full per-GPU read every second;
- sources loop: the non-NVML sources (InfiniBand, host, jobs);
- publisher: at each interval turns the latest state into an immutable
  Snapshot, renders it once, and swaps it in atomically. Because publishing
  is apart from reading, a hung NVML call never stops /metrics: the
  publisher keeps serving the last values and reports how old they are.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from exporter.nvml.backend import NvmlBackend
from exporter.sources.gpu import (
    GpuIdentity,
    GpuState,
    PowerSample,
    read_identity,
    read_power,
    read_state,
)

log = logging.getLogger(__name__)


class Source(Protocol):
    """A non-NVML source: read() returns a plain reading, or raises on failure.

    A source that needs the GPU count (jobs: which file names are GPUs) may also have
    ``set_gpu_count(count)``; the sampler calls it once NVML is open, before any read.
    """

    name: str

    def read(self) -> Any: ...


@dataclass(frozen=True)
class SourceResult:
    reading: Any  # the last successful reading (None if never)
    duration_seconds: float
    success: bool
    errors_total: int
    error: str = ""


@dataclass(frozen=True)
class LoopStats:
    """How well a periodic loop keeps its schedule."""

    target_hertz: float
    iterations_total: int
    overruns_total: int  # ticks skipped because an iteration ran past the next one
    achieved_hertz: float  # over the last few seconds
    jitter_p99_seconds: float  # lateness of tick starts against the schedule
    last_completed: float  # epoch seconds, 0 if never
    busy: str = ""
    last_duration_seconds: float = 0.0
    cpu_seconds_total: float = 0.0  # what the loop is doing right now, when it is inside a call


class PowerBuffer:
    """Bounded ring buffers of (time, watts, joules) per GPU; memory independent of uptime."""

    def __init__(self, gpus: int, capacity: int):
        self.capacity = capacity
        self.times = np.full((gpus, capacity), np.nan)
        self.watts = np.full((gpus, capacity), np.nan)
        self.joules = np.full((gpus, capacity), np.nan)
        self.count = 0  # total rows written
        self._lock = threading.Lock()

    def append(self, samples: list[PowerSample]) -> None:
        with self._lock:
            slot = self.count % self.capacity
            for gpu, sample in enumerate(samples):
                self.times[gpu, slot] = sample.time
                self.watts[gpu, slot] = np.nan if sample.watts is None else sample.watts
                self.joules[gpu, slot] = np.nan if sample.joules is None else sample.joules
            self.count += 1

    def window(self, seconds: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of the last `seconds` of rows, oldest first: times, watts, joules (gpus x n)."""
        with self._lock:
            n = min(self.count, self.capacity)
            order = (np.arange(self.count - n, self.count)) % self.capacity
            times, watts, joules = (self.times[:, order], self.watts[:, order],
                                    self.joules[:, order])
        if n == 0:
            return times, watts, joules
        newest = np.nanmax(times[:, -1]) if np.isfinite(times[:, -1]).any() else 0.0
        keep = np.nanmax(times, axis=0) >= newest - seconds
        return times[:, keep], watts[:, keep], joules[:, keep]

    @property
    def nbytes(self) -> int:
        return self.times.nbytes + self.watts.nbytes + self.joules.nbytes


class _Loop:
    """Runs fn at a fixed rate on a deadline schedule (no drift), in its own thread."""

    def __init__(self, name: str, hertz: float, fn: Callable[[], None], stop: threading.Event,
                 first_delay: float = 0.0):
        self.name, self.hertz, self.fn, self.stop = name, hertz, fn, stop
        self.first_delay = first_delay
        self.first_done = threading.Event()
        self.period = 1.0 / hertz
        self.iterations = 0
        self.overruns = 0
        self.last_completed = 0.0
        self.last_duration = 0.0
        self.cpu_seconds = 0.0  # CPU time of this thread, so each loop's cost is visible
        self.busy = ""
        self._starts: list[float] = []  # recent tick start times (monotonic)
        self._lateness: list[float] = []
        self._keep = max(16, int(hertz * 10))
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"cte-{name}", daemon=True)

    def _run(self) -> None:
        next_tick = time.monotonic() + self.first_delay
        while not self.stop.is_set():
            now = time.monotonic()
            if now < next_tick:
                if self.stop.wait(next_tick - now):
                    return
                now = time.monotonic()
            late = now - next_tick
            cpu0 = time.thread_time()
            try:
                self.fn()
            except Exception:  # a bug in one iteration must not kill the loop
                log.exception("%s loop iteration failed", self.name)
            self.last_duration = time.monotonic() - now
            self.cpu_seconds += time.thread_time() - cpu0
            with self._lock:
                self.iterations += 1
                self.last_completed = time.time()
                self._starts.append(now)
                self._lateness.append(late)
                if len(self._starts) > self._keep:
                    del self._starts[: -self._keep]
                    del self._lateness[: -self._keep]
            self.first_done.set()
            next_tick += self.period
            behind = time.monotonic() - next_tick
            if behind > self.period:  # skip the ticks we cannot make; keep the phase
                skipped = int(behind // self.period)
                self.overruns += skipped
                next_tick += skipped * self.period

    def stats(self) -> LoopStats:
        with self._lock:
            starts = list(self._starts)
            lateness = list(self._lateness)
            iterations, overruns, last = self.iterations, self.overruns, self.last_completed
        achieved = 0.0
        if len(starts) >= 2 and starts[-1] > starts[0]:
            achieved = (len(starts) - 1) / (starts[-1] - starts[0])
        jitter = float(np.percentile(lateness, 99)) if lateness else 0.0
        return LoopStats(self.hertz, iterations, overruns, achieved, jitter, last, self.busy,
                         self.last_duration, self.cpu_seconds)


@dataclass(frozen=True)
class Snapshot:
    """Everything one rendering needs; immutable once built."""

    time: float
    started_at: float
    backend: str  # "nvml" or "fake"
    scenario: str
    driver_version: str
    nvml_version: str
    gpu_count: int
    identities: tuple[GpuIdentity | None, ...]
    states: dict[int, GpuState]
    power: dict[int, PowerSample]
    power_loop: LoopStats
    sweep_loop: LoopStats
    other_loops: dict[str, LoopStats]
    nvml_errors: dict[tuple[str, str], int]
    sources: dict[str, SourceResult] = field(default_factory=dict)
    power_buffer_bytes: int = 0


@dataclass(frozen=True)
class SamplerSettings:
    power_hertz: float = 20.0
    sweep_interval_seconds: float = 1.0
    sources_interval_seconds: float = 5.0
    power_buffer_seconds: float = 660.0
    backend: str = "nvml"
    scenario: str = ""


class Sampler:
    """Reads GPUs and sources on their own threads; publishes Snapshots."""

    def __init__(self, backend: NvmlBackend, settings: SamplerSettings,
                 sources: list[Source] | None = None,
                 on_snapshot: Callable[[Snapshot], None] | None = None):
        self.backend = backend
        self.settings = settings
        self.sources = sources or []
        self.on_snapshot = on_snapshot
        self.started_at = time.time()
        self.gpu_count = 0
        self.identities: list[GpuIdentity | None] = []
        self.states: dict[int, GpuState] = {}
        self.latest_power: dict[int, PowerSample] = {}
        self.source_results: dict[str, SourceResult] = {}
        self._source_errors: dict[str, int] = {}
        self.buffer: PowerBuffer | None = None
        self._stop = threading.Event()
        self._loops: list[_Loop] = []
        self._snapshot: Snapshot | None = None

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> None:
        self.gpu_count = self.backend.open()
        self.identities = [read_identity(self.backend, i) for i in range(self.gpu_count)]
        for source in self.sources:
            set_gpu_count = getattr(source, "set_gpu_count", None)
            if callable(set_gpu_count):
                set_gpu_count(self.gpu_count)
        s = self.settings
        self.buffer = PowerBuffer(self.gpu_count,
                                  max(2, int(s.power_hertz * s.power_buffer_seconds)))
        self.power_loop = _Loop("power", s.power_hertz, self._power_tick, self._stop)
        self.sweep_loop = _Loop("sweep", 1.0 / s.sweep_interval_seconds, self._sweep_tick,
                                self._stop)
        readers = [self.power_loop, self.sweep_loop]
        if self.sources:
            readers.append(_Loop("sources", 1.0 / s.sources_interval_seconds,
                                 self._sources_tick, self._stop))
        publisher = _Loop("publish", 1.0 / s.sweep_interval_seconds, self.publish, self._stop,
                          first_delay=s.sweep_interval_seconds)
        self._loops = [*readers, publisher]
        for loop in readers:
            loop.thread.start()
        # Wait (bounded) for first values, so the first snapshot is complete; a hung
        # NVML call at start-up only delays it.
        deadline = time.monotonic() + max(2.0, 2 * s.sweep_interval_seconds)
        for loop in readers:
            loop.first_done.wait(max(0.0, deadline - time.monotonic()))
        self.publish()
        publisher.thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        for loop in self._loops:
            if loop.thread.is_alive():
                loop.thread.join(timeout)
        self.backend.close()

    # -- loops ---------------------------------------------------------------
    def _power_tick(self) -> None:
        samples = []
        for gpu in range(self.gpu_count):
            self.power_loop.busy = f"gpu {gpu}"
            samples.append(read_power(self.backend, gpu))
        self.power_loop.busy = ""
        for gpu, sample in enumerate(samples):
            self.latest_power[gpu] = sample
        if self.buffer is not None:
            self.buffer.append(samples)

    def _sweep_tick(self) -> None:
        for gpu in range(self.gpu_count):
            self.sweep_loop.busy = f"gpu {gpu}"
            if self.identities[gpu] is None:
                self.identities[gpu] = read_identity(self.backend, gpu)
            state = read_state(self.backend, gpu)
            if state is not None:
                self.states[gpu] = state
        self.sweep_loop.busy = ""

    def _sources_tick(self) -> None:
        for source in self.sources:
            t0 = time.perf_counter()
            previous = self.source_results.get(source.name)
            try:
                reading = source.read()
                ok, error = True, ""
            except Exception as exc:  # a broken source is reported, never fatal
                log.warning("source %s failed: %s", source.name, exc)
                reading = previous.reading if previous else None
                ok, error = False, f"{type(exc).__name__}: {exc}"
                self._source_errors[source.name] = self._source_errors.get(source.name, 0) + 1
            self.source_results[source.name] = SourceResult(
                reading, time.perf_counter() - t0, ok, self._source_errors.get(source.name, 0),
                error)

    def publish(self) -> None:
        snapshot = self.build_snapshot()
        self._snapshot = snapshot
        if self.on_snapshot is not None:
            self.on_snapshot(snapshot)

    def build_snapshot(self) -> Snapshot:
        s = self.settings
        idle = LoopStats(0, 0, 0, 0, 0, 0)
        return Snapshot(
            time=time.time(),
            started_at=self.started_at,
            backend=s.backend,
            scenario=s.scenario,
            driver_version=self.backend.driver_version,
            nvml_version=self.backend.nvml_version,
            gpu_count=self.gpu_count,
            identities=tuple(self.identities),
            states=dict(self.states),
            power=dict(self.latest_power),
            power_loop=self.power_loop.stats() if self._loops else idle,
            sweep_loop=self.sweep_loop.stats() if self._loops else idle,
            other_loops={loop.name: loop.stats() for loop in self._loops[2:]},
            nvml_errors=self.backend.errors.snapshot(),
            sources=dict(self.source_results),
            power_buffer_bytes=self.buffer.nbytes if self.buffer is not None else 0,
        )

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot
