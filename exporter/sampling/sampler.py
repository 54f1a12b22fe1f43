"""The sampler: starts the loops, and turns their latest state into immutable Snapshots.

Loops (each its own thread, or ticked in simulated time by advance()):
- power: every GPU's power samples at the sensor's native rate (sampling/power_loop.py);
- sweep: the catalogue's values, the slow sweep's and energy at their cadences (sampling/sweep.py);
- analysis, stragglers: the live analyses over the buffers (sampling/live_analyses.py);
- one loop per collector (sampling/collectors.py);
- publish: builds a Snapshot from the latest values and hands it on. Because
  publishing is apart from reading, a hung NVML call never stops /metrics.
- kmsg: the kernel log's XIDs, where it is read (sampling/xid_kmsg.py).
XID events come on their own thread (sampling/xids.py). Both XID sources report to one
ledger (sampling/xid_sources.py), which the store (where a state directory is kept) hands
its counts at start and writes new XIDs to before a snapshot serves them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from exporter.gpu.backend import NvmlBackend
from exporter.sampling.buffers import PowerRingView
from exporter.sampling.clock import SYSTEM, Clock
from exporter.sampling.collector_api import (
    Collector,
    CollectorContext,
    ComputeShareSource,
    HoldsResources,
    JobGrouping,
    RankSource,
)
from exporter.sampling.collectors import CollectorRunner
from exporter.sampling.gpus import GpuSet
from exporter.sampling.live_analyses import Analyses
from exporter.sampling.loops import Loop, Together, run_due
from exporter.sampling.power_loop import PowerSampler
from exporter.sampling.settings import SamplerSettings
from exporter.sampling.snapshot import Snapshot
from exporter.sampling.sweep import SweepSampler
from exporter.sampling.xid_ledger import XidStart
from exporter.sampling.xid_sources import XidSources
from exporter.sampling.xids import WAIT_MS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CollectorMaker:
    """A collector to build once the GPUs are known, and how often it reads."""

    name: str
    interval: float
    make: Callable[[CollectorContext], Collector]


# Where each loop ticks, as a fraction of the sweep interval (1 s by default) from the
# sampler's start, after its first tick. The readers, the analyses of what they read and
# the snapshot after them share one thread and one slot (SAMPLING): a thread that sleeps
# a second finds its caches cold and pays for it at each wake-up, so one wake-up a
# second for all of them costs less than one each (docs/performance.md). The loops in
# threads of their own keep slots apart: ticks that coincide fight for the GIL (every
# NVML call and numpy operation releases it), and each hand-over is a wake-up too.
PHASES = {"sampling": 0.0, "kmsg": 0.3, "power_watch": 0.5}
COLLECTOR_PHASES = (0.7, 0.95)  # spread over the collectors in turn
# The loops that share the sampling thread (loops.Together), in this order: due
# together, the analyses come after the reads and the snapshot after the analyses.
SAMPLING = ("power", "sweep", "analysis", "stragglers", "publish")
READERS = ("power", "sweep")  # the loops that read every GPU through NVML
# A reader stuck in one GPU's call holds up the whole sampling thread, the power drain
# with it. `power_watch`, in a thread of its own, half a sweep interval after the
# sampling slot (at most once a second), leaves behind a reader that has been inside one
# GPU's call for READER_PATIENCE: the sampling thread goes on in a fresh thread without
# that GPU at once, well within the ~2.4 s the other GPUs' driver buffers hold, instead
# of after the hang timeout. On an H200 a drain call takes 0.3-0.5 ms and the slowest
# call a sweep makes, the energy counter, 15-24 ms at p99 (docs/nvml-costs.md).
# POWER_WATCH_DELAY: its first watch after the start (simulated time: its only offset).
POWER_WATCH_DELAY = 0.25
READER_PATIENCE = 0.1


class Sampler:
    def __init__(self, backend: NvmlBackend, settings: SamplerSettings,
                 collectors: list[Collector | CollectorMaker] | None = None,
                 on_snapshot: Callable[[Snapshot], None] | None = None, clock: Clock = SYSTEM):
        """`on_snapshot`: the publisher (the app's), handed each snapshot as it is built:
        it judges it and settles it with its verdict (settle()), and publishes both
        together. Without one, each snapshot is settled here with the lost GPUs alone."""
        s = self.settings = settings
        self.clock = clock
        self.on_snapshot = on_snapshot
        self.started_at = clock.time()
        self.gpus = GpuSet(backend, clock, s.hang_timeout_seconds,
                           s.gpu_recovery_interval_seconds)
        self.power = PowerSampler(self.gpus, clock, s.power_drain_interval_seconds,
                                  s.power_sample_rate_hz, s.power_ring_seconds)
        self.sweep = SweepSampler(self.gpus, clock, s.sweep_interval_seconds,
                                  s.gpu_health_interval_seconds, s.energy_interval_seconds,
                                  s.gpu_board_interval_seconds, on_recovered=self.power.reset,
                                  nvlink_reads=s.nvlink_reads)
        self._collector_specs = list(collectors or [])
        self.collectors: list[CollectorRunner] = []
        self.analyses: Analyses | None = None
        self._stop = threading.Event()
        self.xids = XidSources(self.gpus, clock, self._stop, s.kmsg_path)
        self.loops: list[Loop] = []
        self._snapshot: Snapshot | None = None
        self._publishing = threading.Lock()  # start()'s first snapshot and the thread's
        self._opened = False
        self._threads = False
        self._slot: Callable[[float], float | None] = lambda phase: None

    @property
    def backend(self) -> NvmlBackend:
        return self.gpus.backend

    @property
    def gpu_count(self) -> int:
        return self.gpus.count

    def loop(self, name: str) -> Loop | None:
        return next((loop for loop in self.loops if loop.name == name), None)

    def _readers(self) -> list[Loop]:
        """The loops that read every GPU through NVML (power, sweep): those a hang stops."""
        return [loop for loop in self.loops if loop.name in READERS]

    # -- lifecycle -----------------------------------------------------------------
    def open(self) -> int:
        """Open NVML and read the GPUs' identities (once); the GPU count."""
        if not self._opened:
            self.gpus.open()
            self._opened = True
        return self.gpus.count

    def start(self, threads: bool = True) -> None:
        """Open NVML and start sampling: in threads, or (threads=False) only when
        advance() is called, in the clock's simulated time."""
        s = self.settings
        self.open()
        if not self.xids.begun:
            self.xids.begin(XidStart(), None)
        self.power.start()
        self.analyses = Analyses(self.gpus, self.power, self.clock, s.power, s.stragglers,
                                 s.sweep_interval_seconds, self.job_groups,
                                 self.compute_shares, self.gpu_ranks)
        self.sweep.buffer = self.analyses.sweep_buffer
        self.collectors = [self._runner(c) for c in self._collector_specs]
        self._threads = threads
        self.loops = self._make_loops(manual=not threads)
        if not threads:
            for loop in [*self._readers(), *(r.loop for r in self.collectors)]:
                loop.tick()
            self.publish()
            return
        sampling = Together([found for name in SAMPLING
                             if (found := self.loop(name)) is not None], "sampling")
        sampling.start()
        for loop in self.loops:
            if loop.together is None:
                loop.start_thread()
        if s.xid_events:
            self.xids.events.start()
        # Wait (bounded) for first values, so the first snapshot is complete; a hung
        # NVML call at start-up only delays it (and the sampling thread's own publish,
        # a sweep interval after the start, may come first: publish() takes turns).
        wait = max(s.startup_wait_seconds, 2 * s.sweep_interval_seconds)
        deadline = self.clock.monotonic() + wait
        for loop in [*self._readers(), *(r.loop for r in self.collectors)]:
            loop.first_done.wait(max(0.0, deadline - self.clock.monotonic()))
        self.publish()

    def _runner(self, item: Collector | CollectorMaker) -> CollectorRunner:
        s = self.settings
        if isinstance(item, CollectorMaker):
            collector, interval = item.make(self.context()), item.interval
        else:
            collector, interval = item, s.sources_interval_seconds
        return CollectorRunner(collector, interval, self.clock, self._stop,
                               s.hang_timeout_seconds)

    def add_collectors(self, makers: list[CollectorMaker]) -> list[str]:
        """Start, on a running sampler, the collectors not running yet (a reload to a
        metric selection that needs them); the names of those started. The lists the
        publisher reads are replaced whole, never changed in place."""
        running = {r.name for r in self.collectors}
        added = []
        for maker in makers:
            if maker.name in running:
                continue
            try:
                added.append(self._runner(maker))
            except Exception:  # noqa: BLE001 - the others and sampling go on
                log.exception("collector %s could not be started", maker.name)
        if not added:
            return []
        lo, hi = COLLECTOR_PHASES
        count = len(self.collectors) + len(added)
        for i, runner in enumerate(added, start=len(self.collectors)):
            runner.loop.slot = self._slot(lo + (hi - lo) * i / count)
        self.collectors = [*self.collectors, *added]
        self.loops = [*self.loops, *(r.loop for r in added)]
        if self._threads:  # in simulated time, advance() ticks them from now on
            for runner in added:
                runner.loop.start_thread()
        return [r.name for r in added]

    def context(self) -> CollectorContext:
        return CollectorContext(
            gpu_count=self.gpus.count, backend=self.gpus.backend,
            identities=lambda: list(self.gpus.identities), readable=self.gpus.readable,
            energy_joules=lambda gpu: self.power.energy.get(gpu), clock=self.clock.time,
            simulated=self.settings.backend != "nvml")

    def _make_loops(self, manual: bool) -> list[Loop]:
        s, stop, clock = self.settings, self._stop, self.clock
        analyses = self.analyses
        assert analyses is not None  # start() made them
        # in threads, each loop keeps its slot (PHASES); simulated time runs one tick
        # after another and keeps the whole seconds
        t0 = clock.monotonic()
        base = s.sweep_interval_seconds
        slot = (lambda phase: None) if manual else (lambda phase: t0 + phase * base)
        self._slot = slot
        sampling_slot = slot(PHASES["sampling"])  # the sampling thread's loops (SAMPLING)
        power = Loop("power", self.power.period, lambda: self.power.tick(power), stop, clock,
                     slot=sampling_slot)
        sweep = Loop("sweep", s.sweep_interval_seconds, lambda: self.sweep.tick(sweep), stop,
                     clock, slot=sampling_slot)
        loops = [power, sweep]
        if s.power is not None:
            loops.append(Loop("analysis", s.power.update_seconds, analyses.power_tick,
                              stop, clock, first_delay=s.power.update_seconds,
                              slot=sampling_slot))
        if s.stragglers is not None:
            loops.append(Loop("stragglers", 1.0, analyses.straggler_tick, stop, clock,
                              first_delay=2.0, slot=sampling_slot))
        lo, hi = COLLECTOR_PHASES
        for i, runner in enumerate(self.collectors):
            runner.loop.slot = slot(lo + (hi - lo) * i / max(1, len(self.collectors)))
            loops.append(runner.loop)
        if s.xid_events and manual:  # in threads, XIDs have a blocking thread of their own
            loops.append(Loop("xids", 0.1, self.xids.events.poll, stop, clock))
        if self.xids.kernel_log is not None:
            from exporter.sampling.xid_kmsg import POLL_SECONDS

            loops.append(Loop("kmsg", POLL_SECONDS, self.xids.kernel_log.tick, stop, clock,
                              slot=slot(PHASES["kmsg"])))
        if not manual:  # in simulated time no call holds a loop while time passes
            loops.append(Loop("power_watch", max(1.0, s.power_drain_interval_seconds),
                              self._watch_readers, stop, clock, first_delay=POWER_WATCH_DELAY,
                              slot=slot(PHASES["power_watch"])))
        loops.append(Loop("publish", s.sweep_interval_seconds, self.publish, stop, clock,
                          first_delay=s.sweep_interval_seconds, slot=sampling_slot))
        return loops

    def _watch_readers(self) -> None:
        """Leave behind a reader stuck in one GPU's call (see READER_PATIENCE)."""
        for loop in self._readers():
            self.gpus.move_on(loop, READER_PATIENCE)

    def drain_power(self) -> None:
        """One more read of every GPU's power (after stop(): the samples since the last
        drain, so a recording loses nothing at its end)."""
        power = self.loop("power")
        if power is not None:
            self.power.tick(power)

    def advance(self, seconds: float) -> None:
        """Run every tick due in the next `seconds` of the (manual) clock, in order."""
        run_due(self.loops, self.clock, self.clock.monotonic() + seconds)

    def stop(self, timeout: float = 2.0, close: bool = True) -> None:
        """Stop the loops; close NVML unless `close` is False (the caller will)."""
        self._stop.set()
        threads = [(loop.thread, timeout) for loop in self.loops if loop.thread is not None]
        events = self.xids.events.thread
        if events is not None:  # inside an event wait that nothing can cut short
            threads.append((events, max(timeout, WAIT_MS / 1000 + 0.5)))
        for thread, wait in threads:
            if thread.is_alive():
                thread.join(wait)
        kmsg = self.loop("kmsg")
        if self.xids.kernel_log is not None and kmsg is not None and not (
                kmsg.thread is not None and kmsg.thread.is_alive()):
            self.xids.kernel_log.finish()  # the XIDs logged since its last tick, and its cursor
        self.xids.ledger.close()  # the store closes next
        for runner in self.collectors:  # free what they hold in NVML, unless still reading
            reading = runner.loop.thread
            if isinstance(runner.collector, HoldsResources) and (
                    reading is None or not reading.is_alive()):
                runner.collector.close()
        if close:
            self.gpus.backend.close()

    # -- publishing -------------------------------------------------------------------
    def job_groups(self) -> dict[int, str] | None:
        """GPU -> the job (or pod) holding it, from collectors whose readings say so
        (`JobGrouping`); None when none does."""
        groups: dict[int, str] = {}
        for runner in self.collectors:
            reading = runner.result.reading
            if isinstance(reading, JobGrouping):
                groups.update(reading.gpu_groups())
        if not groups:
            return None
        for gpu in range(self.gpus.count):
            groups.setdefault(gpu, "unassigned")
        return groups

    def gpu_ranks(self) -> Mapping[int, int] | None:
        """GPU -> the global rank working on it, from the collector whose reading knows
        (`RankSource`: the processes collector); None without one."""
        for runner in self.collectors:
            reading = runner.result.reading
            if isinstance(reading, RankSource):
                return reading.gpu_ranks()
        return None

    def compute_shares(self) -> dict[int, tuple[tuple[float, float], ...]] | None:
        """GPU -> its recent (time, compute share), from the collector whose reading has
        them (`ComputeShareSource`: the profiling collector); None without one."""
        for runner in self.collectors:
            reading = runner.result.reading
            if isinstance(reading, ComputeShareSource):
                return dict(reading.compute_shares())
        return None

    def publish(self) -> None:
        with self._publishing:  # one snapshot at a time, each settled before the next
            self.gpus.check_hangs(self._readers())
            snapshot = self.build_snapshot()
            if self.on_snapshot is not None:
                self.on_snapshot(snapshot)  # judged, settled and published there
            else:
                self.settle(snapshot)

    def settle(self, snapshot: Snapshot, failed: Iterable[int] = ()) -> Snapshot:
        """The snapshot as it is published: with the goodput account's newest second, in
        which the GPUs lost and those in `failed` (the ones the verdict published with it
        fails) count failed. Called once per snapshot built, before anyone reads it."""
        analyses = self.analyses
        if analyses is not None:
            account = analyses.goodput_tick(snapshot.time, set(snapshot.lost) | set(failed))
            if account is not snapshot.goodput:
                snapshot = snapshot.with_goodput(account)
        self._snapshot = snapshot
        return snapshot

    def build_snapshot(self) -> Snapshot:
        s, gpus = self.settings, self.gpus
        hung, hangs = gpus.hung_now()
        lost = frozenset(gpus.lost)
        gone = lost | set(hung)  # their last values are stale: leave them out

        def fresh(values: dict) -> dict:
            return {gpu: v for gpu, v in values.items() if gpu not in gone}

        analyses = self.analyses
        buffer = self.power.buffer
        return Snapshot(
            time=self.clock.time(), started_at=self.started_at, backend=s.backend,
            scenario=s.scenario, driver_version=gpus.backend.driver_version,
            nvml_version=gpus.backend.nvml_version,
            bindings_version=gpus.backend.bindings_version, gpu_count=gpus.count,
            expected_gpus=s.expected_gpus if s.expected_gpus is not None else gpus.count,
            identities=tuple(gpus.identities), readings=fresh(self.sweep.readings),
            power=fresh(self.power.latest), power_sampling=self.power.stats(),
            loops={loop.name: loop.stats() for loop in self.loops},
            nvml_errors=gpus.backend.errors.totals(),
            collectors={r.name: r.current() for r in self.collectors},
            power_buffer_bytes=buffer.nbytes if buffer is not None else 0,
            device_reads=fresh(self.sweep.device_reads), board=dict(self.sweep.board),
            clock_event_seconds=dict(self.sweep.clock_event_seconds),
            pcie_rates=fresh(self.sweep.pcie_rates),
            xids=self.xids.seen(), xid_events_registered=self.xids.events.registered,
            xid_sources=self.xids.stats(),
            lost=lost, hung=hung, recovery_attempts=dict(gpus.recovery_attempts),
            recoveries=dict(gpus.recoveries), hangs=hangs,
            power_analysis=analyses.power_analysis if analyses else None,
            straggler_analysis=analyses.straggler_analysis if analyses else None,
            goodput=analyses.goodput_analysis if analyses else None,
            power_update_periods=dict(self.power.update_periods),
            observable_band_hz=self.power.band(),
            power_ring=PowerRingView(buffer) if buffer is not None else None)

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot
