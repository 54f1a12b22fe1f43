"""Figures about serving that the Snapshot does not carry (it is the sampler's).

The server and the reloader fill these; the app hands them to the renderer with each
snapshot (exporter/web/families.py turns them into families), so they are as fresh as
the snapshot they are served with and cost a scrape nothing.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class HttpStats:
    max_connections: int
    connections: dict[str, int]  # open connections by state: head, idle, busy
    evictions: dict[str, int]  # connections evicted at the cap, by their state then
    refused_total: int  # new connections refused: every open one was busy
    head_timeouts_total: int  # cut off: handshake and request head took too long
    busy_responses_total: int  # 503: no request slot came free in time


@dataclass(frozen=True)
class ReloadStats:
    successes_total: int
    failures_total: int
    last_successful: bool
    last_success_time: float  # epoch; the start counts as the first successful load


class ReloadStatus:
    """Outcome of config loads: the one at start and every reload (SIGHUP)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ok = self._failed = 0
        self._last_ok = True
        self._last_ok_time = time.time()

    def record(self, ok: bool) -> None:
        with self._lock:
            if ok:
                self._ok += 1
                self._last_ok_time = time.time()
            else:
                self._failed += 1
            self._last_ok = ok

    def stats(self) -> ReloadStats:
        with self._lock:
            return ReloadStats(self._ok, self._failed, self._last_ok, self._last_ok_time)
