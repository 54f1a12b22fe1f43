"""XID events: a thread blocked in NVML's event wait, registered on every GPU, handing
each event to the ledger (sampling/xid_ledger.py)."""

from __future__ import annotations

import logging
import threading

from exporter.gpu.backend import NvmlEventError
from exporter.sampling.clock import Clock
from exporter.sampling.gpus import GpuSet
from exporter.sampling.xid_ledger import Occurrence, XidLedger, valid_xid

log = logging.getLogger(__name__)

# Each wait wakes the thread when no event came: on a VM a wake-up costs 100-300 us of
# CPU, so 2 s (0.5 a second) rather than 0.5 s. Stopping waits for the wait to end
# (NVML has no way to cut it short): up to WAIT_MS.
WAIT_MS = 2000
# Events taken at once behind the first: a bound, not a tuned figure. A report of this
# many is one transaction of as many rows (milliseconds), and a storm goes on in the next.
MAX_BURST = 1000


class XidWatcher:
    def __init__(self, gpus: GpuSet, clock: Clock, stop: threading.Event, ledger: XidLedger):
        self.gpus, self.clock, self.stop, self.ledger = gpus, clock, stop, ledger
        self.registered = 0
        self.thread: threading.Thread | None = None
        self._event_set = None
        self._registered = False

    def start(self) -> None:
        """Wait for events on a thread of their own."""
        self.thread = threading.Thread(target=self._watch, name="cte-xid", daemon=True)
        self.thread.start()

    def _register(self) -> bool:
        if not self._registered:
            self._registered = True
            self._event_set, self.registered = self.gpus.backend.register_xid_events()
        return self._event_set is not None

    def _watch(self) -> None:
        if not self._register():
            return
        while not self.stop.is_set():
            try:
                self._take(WAIT_MS)
            except Exception:  # noqa: BLE001 - XIDs must go on being watched
                log.exception("XID events: unexpected error; carrying on")
                self.stop.wait(1.0)
        self.gpus.backend.call("nvmlEventSetFree", self._event_set)

    def poll(self) -> None:
        """Take every event already due, without waiting (the sampler in simulated time)."""
        if self._register():
            while self._take(0):
                pass

    def _take(self, timeout_ms: int) -> bool:
        """Wait up to timeout_ms for an event, take those already waiting behind it (a
        burst: one report to the ledger, one transaction), and record them; False if none
        came."""
        events: list[tuple[int, int]] = []
        event = self._wait(timeout_ms)
        while event is not None:
            events.append(event)
            if len(events) >= MAX_BURST:
                break
            event = self._wait(0)
        if events:
            self.record(events)
        return bool(events)

    def _wait(self, timeout_ms: int) -> tuple[int, int] | None:
        """One event as (GPU index, -1 if unknown; code), or None if none came."""
        backend = self.gpus.backend
        try:
            event = backend.wait_xid(self._event_set, timeout_ms)
        except NvmlEventError:
            self.stop.wait(1.0 if timeout_ms else 0.0)
            return None
        if event is None:
            return None
        handle, code = event
        gpu = backend.gpu_of(handle, self.gpus.uuids())
        return -1 if gpu is None else gpu, code

    def record(self, events: list[tuple[int, int]]) -> None:
        """(GPU, code) events taken together, reported to the ledger at once."""
        now = self.clock.time()
        for gpu, code in events:
            if valid_xid(code):  # the ledger names the others, refused
                log.warning("XID %d on GPU %d", code, gpu)
        self.ledger.add([Occurrence(gpu, code, now, "nvml",
                                    what=f"NVML event: XID {code} on GPU {gpu}")
                         for gpu, code in events])
