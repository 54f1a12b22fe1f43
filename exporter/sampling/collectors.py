"""Runs each collector on its own loop, so one stuck read stalls only its collector.

A read that raises marks its collector failed (`cte_source_success` 0, the error kept);
a read that has not returned after its stuck bound (twice its interval, at least the
NVML hang timeout) is reported as stuck, with how long, while the other collectors and
the GPU loops go on. The last good reading is kept and served meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from exporter.sampling.clock import Clock
from exporter.sampling.collector_api import Collector
from exporter.sampling.loops import Loop
from exporter.sampling.snapshot import CollectorResult

log = logging.getLogger(__name__)


class CollectorRunner:
    """One collector, its loop and its last result."""

    def __init__(self, collector: Collector, interval: float, clock: Clock,
                 stop: threading.Event, stuck_after: float):
        self.collector, self.clock = collector, clock
        self.name = collector.name
        self.stuck_after = max(stuck_after, 2 * interval)
        self.loop = Loop(self.name, interval, self.read_once, stop, clock)
        self.result = CollectorResult(None, 0.0, False, 0, "not read yet")
        self.errors = 0
        self._reading_since: float | None = None  # monotonic, while inside read()
        self._lock = threading.Lock()

    def read_once(self) -> None:
        t0 = time.perf_counter()
        self._reading_since = self.clock.monotonic()
        previous = self.result
        try:
            reading: Any = self.collector.read()
            ok, error = True, ""
        except Exception as exc:  # a broken collector is reported, never fatal
            log.warning("collector %s failed: %s", self.name, exc)
            reading = previous.reading
            ok, error = False, f"{type(exc).__name__}: {exc}"
            self.errors += 1
        finally:
            self._reading_since = None
        with self._lock:
            self.result = CollectorResult(
                reading, time.perf_counter() - t0, ok, self.errors, error, 0.0,
                self.clock.time() if ok else previous.last_success)

    def current(self) -> CollectorResult:
        """The last result, or a stuck one while a read has not returned for too long."""
        with self._lock:
            result = self.result
        since = self._reading_since
        if since is None:
            return result
        stuck = self.clock.monotonic() - since
        if stuck < self.stuck_after:
            return result
        return CollectorResult(result.reading, result.duration_seconds, False,
                               result.errors_total,
                               f"stuck: a read has not returned for {stuck:.0f} s", stuck,
                               result.last_success)
