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
import pynvml

from exporter.analysis.live_power import (
    PowerAnalysis,
    PowerMonitor,
    PowerSettings,
    detect_update_period,
)
from exporter.analysis.live_stragglers import (
    StragglerAnalysis,
    StragglerMonitor,
    StragglerSettings,
)
from exporter.gpu.backend import NvmlBackend, error_name
from exporter.gpu.health import CLOCK_EVENT_REASONS, GpuHealth, read_health
from exporter.gpu.state import (
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
    cpu_seconds_total: float = 0.0
    restarts_total: int = 0  # what the loop is doing right now, when it is inside a call


class RingBuffer:
    """Bounded ring buffers per GPU: one row a tick, a time and named values per GPU;
    memory fixed at start, independent of uptime."""

    def __init__(self, gpus: int, capacity: int, fields: tuple[str, ...]):
        self.capacity = capacity
        self.times = np.full((gpus, capacity), np.nan)
        self.values = {name: np.full((gpus, capacity), np.nan) for name in fields}
        self.count = 0  # total rows written
        self._lock = threading.Lock()

    def _write(self, times: list[float], columns: dict[str, list[float]]) -> None:
        """One row: a time per GPU (NaN: not read this tick) and each field's column."""
        with self._lock:
            slot = self.count % self.capacity
            self.times[:, slot] = times
            for name, array in self.values.items():
                array[:, slot] = columns[name]
            self.count += 1

    def window_values(self, seconds: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Copies of the last `seconds` of rows, oldest first: times and values (gpus x n)."""
        with self._lock:
            n = min(self.count, self.capacity)
            order = np.arange(self.count - n, self.count) % self.capacity
            times = self.times[:, order]
            values = {name: array[:, order] for name, array in self.values.items()}
        if n == 0 or not np.isfinite(times).any():
            return times[:, :0], {k: v[:, :0] for k, v in values.items()}
        row = np.nanmax(np.where(np.isfinite(times), times, -np.inf), axis=0)
        keep = row >= row.max() - seconds
        return times[:, keep], {k: v[:, keep] for k, v in values.items()}

    @property
    def nbytes(self) -> int:
        return self.times.nbytes + sum(array.nbytes for array in self.values.values())


class PowerBuffer(RingBuffer):
    """The power loop's samples: time, watts and joules per GPU."""

    def __init__(self, gpus: int, capacity: int):
        super().__init__(gpus, capacity, ("watts", "joules"))

    def append(self, samples: list[PowerSample]) -> None:
        nan = np.nan
        self._write([s.time for s in samples], {
            "watts": [nan if s.watts is None else s.watts for s in samples],
            "joules": [nan if s.joules is None else s.joules for s in samples]})

    def window(self, seconds: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """times, watts, joules (gpus x n) of the last `seconds`, oldest first."""
        times, values = self.window_values(seconds)
        return times, values["watts"], values["joules"]


class SweepBuffer(RingBuffer):
    """The sweep's values per GPU, for window analyses (stragglers)."""

    FIELDS = ("sm_clock_hertz", "temperature_celsius", "utilization_gpu_ratio",
              "clock_event_reasons", "power_average_watts")

    def __init__(self, gpus: int, capacity: int):
        super().__init__(gpus, capacity, self.FIELDS)

    def append(self, rows: dict[int, tuple[float, dict[str, float | None]]]) -> None:
        """One row: for each GPU read this sweep, its time and values (missing: NaN)."""
        gpus = self.times.shape[0]
        times = [rows[g][0] if g in rows else np.nan for g in range(gpus)]
        columns = {}
        for name in self.FIELDS:
            column = []
            for g in range(gpus):
                value = rows[g][1].get(name) if g in rows else None
                column.append(np.nan if value is None else value)
            columns[name] = column
        self._write(times, columns)

    window = RingBuffer.window_values


class _Loop:
    """Runs fn at a fixed rate on a deadline schedule (no drift), in its own thread.

    A loop stuck inside one GPU's call can be superseded: restart() starts a fresh
    thread (a new generation) and the stuck one exits when its call finally returns.
    """

    def __init__(self, name: str, hertz: float, fn: Callable[[], None], stop: threading.Event,
                 first_delay: float = 0.0):
        self.name, self.hertz, self.fn, self.stop = name, hertz, fn, stop
        self.first_delay = first_delay
        self.first_done = threading.Event()
        self.period = 1.0 / hertz
        self.iterations = 0
        self.overruns = 0
        self.restarts = 0
        self.last_completed = 0.0
        self.last_duration = 0.0
        self.cpu_seconds = 0.0  # CPU time of this loop's threads, so its cost is visible
        self.generation = 0
        self.busy_gpu: int | None = None  # the GPU the current thread is reading
        self.busy_since = 0.0
        self._local = threading.local()
        self._starts: list[float] = []  # recent tick start times (monotonic)
        self._lateness: list[float] = []
        self._keep = max(16, int(hertz * 10))
        self._lock = threading.Lock()
        self.thread = self._new_thread()

    def _new_thread(self) -> threading.Thread:
        return threading.Thread(target=self._run, args=(self.generation,),
                                name=f"cte-{self.name}", daemon=True)

    @property
    def busy(self) -> str:
        gpu = self.busy_gpu
        return "" if gpu is None else f"gpu {gpu}"

    @property
    def current(self) -> bool:
        """True in the loop's current thread; False in a superseded one."""
        return getattr(self._local, "generation", self.generation) == self.generation

    def enter(self, gpu: int) -> None:
        if self.current:
            self.busy_gpu, self.busy_since = gpu, time.monotonic()

    def leave(self) -> None:
        if self.current:
            self.busy_gpu = None

    def restart(self) -> None:
        """Abandon the current thread (stuck in a call) and continue in a new one."""
        with self._lock:
            self.generation += 1
            self.restarts += 1
            self.busy_gpu = None
            self.first_delay = 0.0
            self.thread = self._new_thread()
        self.thread.start()

    def _run(self, generation: int) -> None:
        self._local.generation = generation
        next_tick = time.monotonic() + self.first_delay
        while not self.stop.is_set() and generation == self.generation:
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
            with self._lock:
                self.cpu_seconds += time.thread_time() - cpu0
                if generation != self.generation:
                    return  # superseded while stuck: the new thread carries on
                self.last_duration = time.monotonic() - now
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
        jitter = sorted(lateness)[int(0.99 * (len(lateness) - 1))] if lateness else 0.0
        return LoopStats(self.hertz, iterations, overruns, achieved, jitter, last, self.busy,
                         self.last_duration, self.cpu_seconds, self.restarts)


@dataclass(frozen=True)
class XidRecord:
    count: int
    last_seen: float  # epoch seconds


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
    expected_gpus: int = 0
    health: dict[int, GpuHealth] = field(default_factory=dict)
    clock_event_seconds: dict[tuple[int, str], float] = field(default_factory=dict)
    xids: dict[tuple[int, int], XidRecord] = field(default_factory=dict)  # (gpu, code)
    xid_events_registered: int = 0  # GPUs registered for XID events
    lost: frozenset[int] = frozenset()  # GPUs NVML reports lost (GpuIsLost)
    hung: dict[int, float] = field(default_factory=dict)  # GPU stuck in a call -> since (epoch)
    recovery_attempts: dict[int, int] = field(default_factory=dict)
    recoveries: dict[int, int] = field(default_factory=dict)
    hangs: dict[int, int] = field(default_factory=dict)
    power_analysis: PowerAnalysis | None = None
    straggler_analysis: StragglerAnalysis | None = None
    power_update_periods: dict[int, float] = field(default_factory=dict)  # sensor, by GPU
    observable_band_hz: tuple[float, float] = (0.0, 0.0)

    def up(self, gpu: int) -> bool:
        return (gpu not in self.lost and gpu not in self.hung
                and self.identities[gpu] is not None)


@dataclass(frozen=True)
class SamplerSettings:
    power_hertz: float = 20.0
    sweep_interval_seconds: float = 1.0
    sources_interval_seconds: float = 5.0
    power_buffer_seconds: float = 660.0
    backend: str = "nvml"
    scenario: str = ""
    expected_gpus: int | None = None  # None: the count NVML reports at start
    hang_timeout_seconds: float = 2.0  # a call inside NVML this long marks its GPU hung
    recovery_interval_seconds: float = 10.0  # how often to retry a lost GPU
    health_interval_seconds: float = 5.0  # ECC, row remap, NVLink: every few sweeps
    xid_events: bool = True
    power: PowerSettings | None = field(default_factory=PowerSettings)  # None: no analysis
    stragglers: StragglerSettings | None = field(default_factory=StragglerSettings)


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
        self.health: dict[int, GpuHealth] = {}
        self.latest_power: dict[int, PowerSample] = {}
        self.source_results: dict[str, SourceResult] = {}
        self._source_errors: dict[str, int] = {}
        self.clock_event_seconds: dict[tuple[int, str], float] = {}
        self._last_state_time: dict[int, float] = {}
        self.xids: dict[tuple[int, int], XidRecord] = {}
        self.xid_registered = 0
        self.hung: dict[int, float] = {}  # GPU -> when the stuck call began (epoch)
        self.hangs: dict[int, int] = {}
        self.recovery_attempts: dict[int, int] = {}
        self.recoveries: dict[int, int] = {}
        self._last_recovery: dict[int, float] = {}
        self.buffer: PowerBuffer | None = None
        self.recorder: Any = None  # record: gets power(samples) and sweep(gpu, state, health)
        self.power_monitor: PowerMonitor | None = None
        self.power_analysis: PowerAnalysis | None = None
        self.sweep_buffer: SweepBuffer | None = None
        self.straggler_monitor: StragglerMonitor | None = None
        self.straggler_analysis: StragglerAnalysis | None = None
        self._stop = threading.Event()
        self._loops: list[_Loop] = []
        self._xid_thread: threading.Thread | None = None
        self._lock = threading.Lock()
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
        if s.power is not None:
            periods = detect_update_period(self.backend, self.gpu_count)
            self.power_monitor = PowerMonitor(s.power, s.power_hertz, periods)
            readers.append(_Loop("analysis", 1.0 / s.power.update_seconds, self._analysis_tick,
                                 self._stop, first_delay=s.power.update_seconds))
        if s.stragglers is not None:
            self.sweep_buffer = SweepBuffer(self.gpu_count, max(
                2, int(s.stragglers.window_seconds * 1.5 / s.sweep_interval_seconds)))
            self.straggler_monitor = StragglerMonitor(s.stragglers)
            readers.append(_Loop("stragglers", 1.0, self._straggler_tick, self._stop,
                                 first_delay=2.0))
        if self.sources:
            readers.append(_Loop("sources", 1.0 / s.sources_interval_seconds,
                                 self._sources_tick, self._stop))
        publisher = _Loop("publish", 1.0 / s.sweep_interval_seconds, self.publish, self._stop,
                          first_delay=s.sweep_interval_seconds)
        self._loops = [*readers, publisher]
        for loop in readers:
            loop.thread.start()
        if s.xid_events:
            self._xid_thread = threading.Thread(target=self._watch_xids, name="cte-xid",
                                                daemon=True)
            self._xid_thread.start()
        # Wait (bounded) for first values, so the first snapshot is complete; a hung
        # NVML call at start-up only delays it.
        deadline = time.monotonic() + max(2.0, 2 * s.sweep_interval_seconds)
        for loop in readers:
            if loop.name not in ("analysis", "stragglers"):
                loop.first_done.wait(max(0.0, deadline - time.monotonic()))
        self.publish()
        publisher.thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        threads = [loop.thread for loop in self._loops]
        if self._xid_thread is not None:
            threads.append(self._xid_thread)
        for thread in threads:
            if thread.is_alive():
                thread.join(timeout)
        self.backend.close()

    # -- per-GPU iteration that survives a stuck call -------------------------------
    def _readable(self, gpu: int) -> bool:
        return gpu not in self.backend.lost and gpu not in self.hung

    def _each_gpu(self, loop: _Loop, read: Callable[[int], None]) -> bool:
        """read(gpu) for every readable GPU; False if the loop was superseded meanwhile."""
        for gpu in range(self.gpu_count):
            if not self._readable(gpu):
                continue
            loop.enter(gpu)
            try:
                read(gpu)
            finally:
                loop.leave()
            if gpu in self.hung:  # it was declared hung while we waited: it answered now
                with self._lock:
                    self.hung.pop(gpu, None)
            if not loop.current:
                return False
        return True

    def _check_hangs(self) -> None:
        """A loop inside one GPU's call for too long: mark that GPU hung, go on without it."""
        now = time.monotonic()
        for loop in (self.power_loop, self.sweep_loop):
            gpu = loop.busy_gpu
            if gpu is None or now - loop.busy_since < self.settings.hang_timeout_seconds:
                continue
            log.warning("GPU %d: %s loop stuck in an NVML call for %.1f s; going on without it",
                        gpu, loop.name, now - loop.busy_since)
            with self._lock:
                self.hung[gpu] = time.time() - (now - loop.busy_since)
                self.hangs[gpu] = self.hangs.get(gpu, 0) + 1
            loop.restart()

    # -- loops ---------------------------------------------------------------
    def _power_tick(self) -> None:
        samples: dict[int, PowerSample] = {}

        def read(gpu: int) -> None:
            samples[gpu] = read_power(self.backend, gpu)

        if not self._each_gpu(self.power_loop, read):
            return
        self.latest_power.update(samples)
        if self.recorder is not None:
            self.recorder.power(samples)
        if self.buffer is not None:
            now = time.time()
            self.buffer.append([samples.get(g) or PowerSample(now, None, None)
                                for g in range(self.gpu_count)])

    def _sweep_tick(self) -> None:
        def read(gpu: int) -> None:
            if self.identities[gpu] is None:
                self.identities[gpu] = read_identity(self.backend, gpu)
            now = time.time()
            last = self.health.get(gpu)
            slow_due = last is None or (
                now - last.time >= self.settings.health_interval_seconds - 0.05)
            state = read_state(self.backend, gpu, None if slow_due else self.states.get(gpu))
            if state is not None:
                self._count_clock_events(gpu, state)
                self.states[gpu] = state
            ident = self.identities[gpu]
            if slow_due:
                health = read_health(self.backend, gpu, ident.nvlinks if ident else 0, now)
                if health is not None:
                    self.health[gpu] = health
            if self.recorder is not None and state is not None:
                self.recorder.sweep(gpu, state, self.health.get(gpu))

        if self._each_gpu(self.sweep_loop, read):
            self._recover_lost()
            self._record_sweep()

    def _record_sweep(self) -> None:
        if self.sweep_buffer is None:
            return
        rows = {}
        for gpu in range(self.gpu_count):
            state = self.states.get(gpu)
            if state is None or not self._readable(gpu):
                continue
            rows[gpu] = (state.time, {
                "sm_clock_hertz": state.sm_clock_hertz,
                "temperature_celsius": state.temperature_celsius,
                "utilization_gpu_ratio": state.utilization_gpu_ratio,
                "power_average_watts": state.power_average_watts,
                "clock_event_reasons": state.clock_event_reasons,
            })
        self.sweep_buffer.append(rows)

    def _straggler_tick(self) -> None:
        monitor, power, sweep = self.straggler_monitor, self.buffer, self.sweep_buffer
        if monitor is None or power is None or sweep is None:
            return
        s = monitor.settings
        power_t, watts, _ = power.window(max(s.stall_context_seconds, s.window_seconds))
        sweep_t, values = sweep.window(s.window_seconds)
        self.straggler_analysis = monitor.update(time.time(), power_t, watts, sweep_t, values,
                                                 self._job_groups())

    def _job_groups(self) -> dict[int, str] | None:
        """GPU -> job from the job mapping, where each GPU runs one job; else None."""
        result = self.source_results.get("jobs")
        jobs = getattr(result.reading, "jobs", None) if result is not None else None
        if not jobs:
            return None
        groups = {gpu: ids[0] for gpu, ids in jobs.items() if len(ids) == 1}
        for gpu in range(self.gpu_count):
            groups.setdefault(gpu, "unassigned")
        return groups

    def _analysis_tick(self) -> None:
        monitor, buffer = self.power_monitor, self.buffer
        if monitor is None or buffer is None:
            return
        now = time.time()
        times, watts, _ = buffer.window(monitor.seconds_needed(now))
        limits = [i.default_power_limit_watts if i is not None else None
                  for i in self.identities]
        tdp = None if any(v is None for v in limits) else np.array(limits, dtype=float)
        self.power_analysis = monitor.update(times, watts, tdp, now)

    def analysis_updates(self) -> int:
        loop = next((loop for loop in self._loops if loop.name == "analysis"), None)
        return 0 if loop is None else loop.iterations

    def _count_clock_events(self, gpu: int, state: GpuState) -> None:
        """Accumulate seconds each clock-event reason was active, sweep to sweep."""
        previous = self._last_state_time.get(gpu)
        self._last_state_time[gpu] = state.time
        if previous is None or state.clock_event_reasons is None:
            return
        # a gap longer than a few sweeps (a hang, a lost GPU) is not counted as active
        elapsed = min(state.time - previous, 3 * self.settings.sweep_interval_seconds)
        for reason, bit in CLOCK_EVENT_REASONS.items():
            key = (gpu, reason)
            if state.clock_event_reasons & bit:
                self.clock_event_seconds[key] = self.clock_event_seconds.get(key, 0.0) + elapsed
            else:
                self.clock_event_seconds.setdefault(key, 0.0)

    def _recover_lost(self) -> None:
        """Retry each lost GPU every recovery interval: fresh handle, same UUID."""
        now = time.monotonic()
        for gpu in sorted(self.backend.lost):
            if now - self._last_recovery.get(gpu, -1e9) < self.settings.recovery_interval_seconds:
                continue
            self._last_recovery[gpu] = now
            self.recovery_attempts[gpu] = self.recovery_attempts.get(gpu, 0) + 1
            self.backend.lost.discard(gpu)
            handle = self.backend.reacquire(gpu)
            ident = read_identity(self.backend, gpu) if handle is not None else None
            known = self.identities[gpu]
            if ident is None or gpu in self.backend.lost or (
                    known is not None and ident.uuid != known.uuid):
                self.backend.lost.add(gpu)
                continue
            log.info("GPU %d (%s) answers again", gpu, ident.uuid)
            self.identities[gpu] = ident
            self.recoveries[gpu] = self.recoveries.get(gpu, 0) + 1

    def _watch_xids(self) -> None:
        """Wait for XID events on every GPU; each reaches the next snapshot."""
        backend = self.backend
        event_set = backend.call("nvmlEventSetCreate")
        if event_set is None:
            return
        for gpu in range(self.gpu_count):
            handle = backend.handle(gpu)
            if handle is None:
                continue
            try:  # only the XID bit: if any bit of a mask is unsupported, none registers
                backend.nvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                self.xid_registered += 1
            except backend.nvml.NVMLError as exc:
                backend.errors.add("nvmlDeviceRegisterEvents", error_name(exc))
        uuids = {ident.uuid: ident.index for ident in self.identities if ident is not None}
        while not self._stop.is_set():
            try:
                data = backend.nvml.nvmlEventSetWait(event_set, 500)
            except backend.nvml.NVMLError_Timeout:
                continue
            except backend.nvml.NVMLError as exc:
                backend.errors.add("nvmlEventSetWait", error_name(exc))
                self._stop.wait(1.0)
                continue
            uuid = backend.call("nvmlDeviceGetUUID", data.device)
            gpu = uuids.get(uuid) if uuid is not None else None
            if gpu is None:
                gpu = backend.call("nvmlDeviceGetIndex", data.device)
            self.record_xid(-1 if gpu is None else gpu, int(data.eventData))
        backend.call("nvmlEventSetFree", event_set)

    def record_xid(self, gpu: int, code: int) -> None:
        log.warning("XID %d on GPU %d", code, gpu)
        with self._lock:
            previous = self.xids.get((gpu, code))
            self.xids[(gpu, code)] = XidRecord((previous.count if previous else 0) + 1,
                                               time.time())

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
        self._check_hangs()
        snapshot = self.build_snapshot()
        self._snapshot = snapshot
        if self.on_snapshot is not None:
            self.on_snapshot(snapshot)

    def build_snapshot(self) -> Snapshot:
        s = self.settings
        with self._lock:
            hung = dict(self.hung)
            xids = dict(self.xids)
            hangs = dict(self.hangs)
        lost = frozenset(self.backend.lost)
        gone = lost | set(hung)  # their last values are stale: leave them out

        def fresh(values: dict) -> dict:
            return {gpu: v for gpu, v in values.items() if gpu not in gone}

        return Snapshot(
            time=time.time(),
            started_at=self.started_at,
            backend=s.backend,
            scenario=s.scenario,
            driver_version=self.backend.driver_version,
            nvml_version=self.backend.nvml_version,
            gpu_count=self.gpu_count,
            identities=tuple(self.identities),
            states=fresh(self.states),
            power=fresh(self.latest_power),
            power_loop=self.power_loop.stats(),
            sweep_loop=self.sweep_loop.stats(),
            other_loops={loop.name: loop.stats() for loop in self._loops[2:]},
            nvml_errors=self.backend.errors.snapshot(),
            sources=dict(self.source_results),
            power_buffer_bytes=self.buffer.nbytes if self.buffer is not None else 0,
            expected_gpus=s.expected_gpus if s.expected_gpus is not None else self.gpu_count,
            health=fresh(self.health),
            clock_event_seconds=dict(self.clock_event_seconds),
            xids=xids,
            xid_events_registered=self.xid_registered,
            lost=lost,
            hung=hung,
            recovery_attempts=dict(self.recovery_attempts),
            recoveries=dict(self.recoveries),
            hangs=hangs,
            power_analysis=self.power_analysis,
            straggler_analysis=self.straggler_analysis,
            power_update_periods=(dict(self.power_monitor.update_periods)
                                  if self.power_monitor else {}),
            observable_band_hz=self.power_monitor.band if self.power_monitor else (0.0, 0.0),
        )

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot
