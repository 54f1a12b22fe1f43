"""Periodic loops on a deadline schedule, each in its own thread or several in one
(`Together`), or ticked by hand.

A loop runs `fn` every `period` seconds without drift; when an iteration overruns, the
missed ticks are counted and skipped, keeping the phase. A loop given a `slot` keeps to
the ticks slot + k * period (from its first tick, or a restart, it moves onto the next
one), so loops of one period can tick apart (see Sampler: ticks that coincide fight for
the GIL). A loop stuck inside one GPU's call can be superseded: restart() starts a fresh
thread (a new generation) and the stuck one exits when its call finally returns.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from exporter.sampling.clock import SYSTEM, Clock
from exporter.sampling.snapshot import LoopStats

log = logging.getLogger(__name__)


class Loop:
    def __init__(self, name: str, period: float, fn: Callable[[], None],
                 stop: threading.Event, clock: Clock = SYSTEM, first_delay: float = 0.0,
                 slot: float | None = None):
        self.name, self.period, self.fn, self.stop, self.clock = name, period, fn, stop, clock
        self.first_delay = first_delay
        self.slot = slot  # monotonic: one tick of the schedule it keeps after its first
        self.first_done = threading.Event()
        self.iterations = 0
        self.overruns = 0
        self.restarts = 0
        self.last_completed = 0.0
        self.last_duration = 0.0
        self.cpu_seconds = 0.0  # CPU time of this loop's threads, so its cost is visible
        self.generation = 0
        self.busy_gpu: int | None = None  # the GPU the current thread is reading
        self.busy_since = 0.0
        self.next_tick: float | None = None  # monotonic; None until started
        self._local = threading.local()
        self._starts: list[float] = []  # recent tick start times (monotonic)
        self._lateness: list[float] = []
        self._keep = max(16, int(10 / period))
        self._lock = threading.Lock()
        self._stats: tuple[tuple, LoopStats] | None = None  # (what it was made of, stats)
        self.thread: threading.Thread | None = None
        self.together: Together | None = None  # the loops it shares its thread with

    @property
    def due(self) -> float:
        """When the next tick is due (monotonic); the loop must have started."""
        assert self.next_tick is not None, f"loop {self.name} has not started"
        return self.next_tick

    @property
    def hertz(self) -> float:
        return 1.0 / self.period

    # -- which GPU the loop is inside (hang supervision) --------------------------------
    @property
    def current(self) -> bool:
        """True in the loop's current thread; False in a superseded one."""
        return getattr(self._local, "generation", self.generation) == self.generation

    def enter(self, gpu: int) -> None:
        if self.current:  # since first: a watcher that reads the GPU first sees its since
            self.busy_since = self.clock.monotonic()
            self.busy_gpu = gpu

    def leave(self) -> None:
        if self.current:
            self.busy_gpu = None

    # -- running ---------------------------------------------------------------------------
    def start_thread(self) -> None:
        self.next_tick = self.clock.monotonic() + self.first_delay
        self.thread = self._new_thread()
        self.thread.start()

    def _new_thread(self) -> threading.Thread:
        return threading.Thread(target=self._run, args=(self.generation,),
                                name=f"cte-{self.name}", daemon=True)

    def restart(self) -> None:
        """Abandon the current thread (stuck in a call) and continue in a new one (with
        the loops it shares its thread with)."""
        together = self.together
        with self._lock:
            self.generation += 1
            self.restarts += 1
            self.busy_gpu = None
            self.next_tick = self.clock.monotonic()
            if together is None:
                self.thread = thread = self._new_thread()
        if together is not None:
            together.restart()
        else:
            thread.start()

    def _run(self, generation: int) -> None:
        self._local.generation = generation
        while not self.stop.is_set() and generation == self.generation:
            wait = self.due - self.clock.monotonic()
            if wait > 0 and self.stop.wait(wait):
                return
            if not self.tick():
                return  # superseded while stuck: the new thread carries on

    def tick(self) -> bool:
        """One iteration now (late against the schedule as it is); False if superseded."""
        now = self.clock.monotonic()
        if self.next_tick is None:
            self.next_tick = now
        late = max(0.0, now - self.next_tick)
        generation = self.generation
        cpu0 = time.thread_time()
        try:
            self.fn()
        except Exception:  # a bug in one iteration must not kill the loop
            log.exception("%s loop iteration failed", self.name)
        with self._lock:
            self.cpu_seconds += time.thread_time() - cpu0
            if generation != self.generation:
                return False
            end = self.clock.monotonic()
            self.last_duration = end - now
            self.iterations += 1
            self.last_completed = self.clock.time()
            self._starts.append(now)
            self._lateness.append(late)
            if len(self._starts) > self._keep:
                del self._starts[: -self._keep]
                del self._lateness[: -self._keep]
            self.next_tick += self.period
            if self.slot is not None:  # onto its slot (after the first tick, or a restart)
                self.next_tick = self.slot + math.ceil(
                    (self.next_tick - self.slot) / self.period - 1e-6) * self.period
            behind = end - self.next_tick
            if behind > self.period:  # skip the ticks we cannot make; keep the phase
                skipped = int(behind // self.period)
                self.overruns += skipped
                self.next_tick += skipped * self.period
        self.first_done.set()
        return True

    def stats(self) -> LoopStats:
        """The loop's figures; the same object again while none of them moved (they are
        asked for every snapshot, and most loops tick less often)."""
        with self._lock:
            key = (self.period, self.iterations, self.overruns, self.restarts,
                   self.busy_gpu, self.cpu_seconds, self.last_duration, self.last_completed)
            if self._stats is not None and self._stats[0] == key:
                return self._stats[1]
            starts = list(self._starts)
            lateness = list(self._lateness)
            iterations, overruns, last = self.iterations, self.overruns, self.last_completed
        achieved = 0.0
        if len(starts) >= 2 and starts[-1] > starts[0]:
            achieved = (len(starts) - 1) / (starts[-1] - starts[0])
        jitter = sorted(lateness)[int(0.99 * (len(lateness) - 1))] if lateness else 0.0
        busy = "" if key[4] is None else f"gpu {key[4]}"
        out = LoopStats(1.0 / key[0], iterations, overruns, achieved, jitter, last, busy,
                        key[6], key[5], key[3])
        self._stats = (key, out)
        return out


class Together:
    """Loops run in one thread, each on its own schedule and with its own figures: one
    thread to wake instead of several, and loops due at the same time run back to back,
    in list order (so one wake-up a second serves them all: a thread that sleeps finds
    its caches cold, and each wake-up pays for that again).

    A loop among them that is stuck in a call can be superseded like any (Loop.restart):
    the others go on with it in a fresh thread, and the stuck one exits when its call
    returns. Something outside the thread must watch for that (Sampler: `power_watch`)."""

    def __init__(self, loops: list[Loop], name: str):
        self.loops, self.name = loops, name
        self.generation = 0
        self.thread: threading.Thread | None = None
        for loop in loops:
            loop.together = self

    def start(self) -> threading.Thread:
        now = self.loops[0].clock.monotonic()
        for loop in self.loops:
            loop.next_tick = now + loop.first_delay
        return self._spawn()

    def restart(self) -> None:
        """Go on in a fresh thread; the current one exits when its call returns."""
        self._spawn()

    def _spawn(self) -> threading.Thread:
        self.generation += 1
        thread = threading.Thread(target=self._run, args=(self.generation,),
                                  name=f"cte-{self.name}", daemon=True)
        self.thread = thread
        for loop in self.loops:
            loop.thread = thread
        thread.start()
        return thread

    def _run(self, generation: int) -> None:
        loops = self.loops
        stop, clock = loops[0].stop, loops[0].clock
        for loop in loops:  # this thread is each loop's current one (Loop.current)
            loop._local.generation = loop.generation
        while not stop.is_set() and generation == self.generation:
            loop = min(loops, key=lambda lp: lp.due)  # the first of those due together
            wait = loop.due - clock.monotonic()
            if wait > 0 and stop.wait(wait):
                return
            if generation != self.generation or not loop.tick():
                return  # superseded while stuck: the fresh thread carries on


def run_due(loops: list[Loop], clock, until: float) -> None:
    """Synchronously run every loop tick due up to `until` (monotonic), in time order,
    moving a manual clock to each tick: the whole sampler in simulated time."""
    for loop in loops:
        if loop.next_tick is None:
            loop.next_tick = clock.monotonic() + loop.first_delay
    while True:
        loop = min(loops, key=lambda lp: lp.due)
        if loop.due > until:
            break
        clock.set(loop.due)
        loop.tick()
    clock.set(until)
