"""The live history: what each snapshot and each new XID add, kept in memory and written
to the store by one thread in batches (at most one transaction every FLUSH_SECONDS, none
when nothing happened).

At start the history hands the sampler what it stored (`begin`): each GPU's XID counts,
the last XIDs NVML reported whose log line was not read yet, the slots of GPUs since gone,
and where the kernel log was left this boot. The sampler
reads both XID sources and counts each XID once (exporter/sampling/xid_ledger.py); the
history is its sink: `write_xids` commits new XIDs, with all that is pending, before it
returns, so a count is on disk before any snapshot serves it and a restart never
continues from below what was served. A burst is one transaction. The snapshot itself is
never changed: the history only reads it (`observe`: the GPUs' identities; `observe_health`:
the verdict's transitions).

Every record is checked before it reaches the store: a row the store cannot hold is
refused alone, counted by reason (`refused`, with the XIDs the sampler refused) and named in
a log line; the batch around it is written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from exporter.gpu.reading import GpuIdentity
from exporter.health.faults import EPISODES
from exporter.health.model import FAILED, WARNING, NodeHealth, Verdict
from exporter.history.episodes import NODE, Episode, GpuKey, Merger
from exporter.history.identities import GpuIdentities
from exporter.history.store import Loaded, Store
from exporter.history.writer import Writer
from exporter.sampling import kmsg
from exporter.sampling.snapshot import Snapshot, XidRecord
from exporter.sampling.xid_ledger import Occurrence, XidStart

log = logging.getLogger(__name__)

FLUSH_SECONDS = 5.0
WINDOW_SECONDS = {"1d": 86_400.0, "7d": 7 * 86_400.0, "28d": 28 * 86_400.0}
KEEP_SECONDS = WINDOW_SECONDS["28d"]
# Which source saw a GPU's and code's last XID, stored beside its count (bits): NVML only
# (its log line not read yet), the kernel log only, or both (matched).
NVML_ONLY, LOG_ONLY, BOTH = 1, 2, 3
_SOURCE = {"nvml": NVML_ONLY, "kmsg": LOG_ONLY}
# The history judges nothing: a check of the verdict (exporter/health/) turning warning or
# failed is an episode of its kind, so a threshold changed in the health settings moves the
# history with the verdict. XIDs are events, recorded as they come; a failed verdict is a
# `health_failed` episode besides.
CHECK_KINDS = EPISODES  # each check's kind, from the fault table (exporter/health/faults.py)


@dataclass(frozen=True)
class HistoryStats:
    transactions: int
    write_failures: int
    dropped: int
    resets: dict[str, int]
    replacements: int
    created: float
    refused: dict[str, int]  # records refused, by reason (writer.REFUSED_REASONS)


class History:
    def __init__(self, store: Store, node: str, *, clock: Callable[[], float] = time.time,
                 reads_kernel_log: bool = True, boot_id_path: str = kmsg.BOOT_ID,
                 flush_seconds: float = FLUSH_SECONDS):
        self.store, self.node, self.clock = store, node, clock
        self.boot_id = kmsg.read_boot_id(boot_id_path)
        self.boot_id_path = boot_id_path
        self.reads_kernel_log = reads_kernel_log
        self.flush_seconds = flush_seconds
        self.lock = threading.Lock()
        self.writer = Writer(store, self.lock)
        self.merger = Merger()
        self.recent: list[Episode] = []
        self.version = 0  # bumped by each new episode (the families' cache key)
        self.xids: dict[tuple[GpuKey, int], list[float]] = {}  # -> [count, last seen]
        # -> [who saw the last XID (NVML_ONLY, LOG_ONLY, BOTH), its time]
        self.xid_seen_by: dict[tuple[GpuKey, int], list[float]] = {}
        self.levels: dict[tuple[GpuKey, str], float] = {}
        self.gpus = GpuIdentities()
        self._last_health: NodeHealth | None = None
        self.cursor = -1  # the kernel log's, as stored for this boot
        self.cursor_stored: float | None = None  # when that was stored; None: never
        self.created = 0.0
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None

    # -- start and stop -----------------------------------------------------------
    def load(self) -> None:
        """Read what the store holds (the store is open)."""
        loaded: Loaded = self.store.load(self.clock() - KEEP_SECONDS)
        self.created = loaded.created
        for (serial, uuid, name, key), (value, last) in loaded.counters.items():
            if name == "xid":
                self.xids[((serial, uuid), int(key))] = [value, last]
            elif name == "xid_source":
                self.xid_seen_by[((serial, uuid), int(key))] = [value, last]
            elif name == "level" and (key == "verdict_failed" or key.startswith("check ")):
                # a check's state (levels of older versions' own rules are left unread)
                self.levels[((serial, uuid), key)] = value
        for episode in loaded.episodes:
            self.merger.resume(episode)
            if episode.start >= self.clock() - KEEP_SECONDS:
                self.recent.append(episode)
        self.gpus.slots = dict(loaded.slots)
        self.gpus.replacements = loaded.replacements
        stored = loaded.cursors.get(self.boot_id) if self.boot_id else None
        self.cursor, self.cursor_stored = stored if stored is not None else (-1, None)
        self.store.set_node(self.node)
        if self.reads_kernel_log and not self.boot_id:
            log.warning("history: %s", self._no_boot_id())

    def begin(self, identities: Sequence[GpuIdentity | None], driver_version: str) -> XidStart:
        """The GPUs here at start identified; what the sampler continues from: their XID
        counts, the slots of GPUs since gone, the kernel log's cursor for this boot."""
        with self.lock:
            self.gpus.observe(identities, driver_version, self.clock(), self.writer.batch,
                              self.boot_id)
            counts = {}
            waiting = {}
            for (key, code), (count, last) in self.xids.items():
                gpu = self.gpus.index_of.get(key, -1 if key == NODE else None)
                if gpu is not None:  # a GPU gone keeps its count on disk, not served
                    counts[(gpu, code)] = XidRecord(int(count), last)
                    if self._waits_for_its_line(key, code, last):
                        waiting[(gpu, code)] = last
            later: dict[GpuKey, dict[int, XidRecord]] = {}  # GPUs lost at start: theirs later
            for (key, code), (count, last) in self.xids.items():
                if key != NODE and key not in self.gpus.index_of:
                    later.setdefault(key, {})[code] = XidRecord(int(count), last)
            here = {kmsg.pci_slot(i.pci_bus_id) for i in identities if i is not None}
            return XidStart(counts, later, frozenset(self.gpus.slots) - here,
                            self.cursor if self.boot_id else None,
                            "" if self.boot_id else f"no boot id: {self.boot_id_path} "
                            "cannot be read", waiting)

    def _waits_for_its_line(self, key: GpuKey, code: int, last: float) -> bool:
        """Whether the last XID of `code` on GPU `key` (at `last`) is an NVML report whose
        kernel-log line was not read yet, and will be: the log goes on from this boot's
        cursor. Where the store does not say who saw it (an older version wrote it), it
        waits unless the log was read after it."""
        if not self.boot_id:
            return False  # the log is read from its end: a line logged before is never read
        seen = self.xid_seen_by.get((key, code))
        if seen is not None and seen[1] == last:
            return int(seen[0]) == NVML_ONLY
        return self.cursor_stored is None or self.cursor_stored < last

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="cte-history", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Write what is pending, close the store."""
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=30)
            self.thread = None
        else:
            self.flush()
        self.store.close()

    def _run(self) -> None:
        while not self.stop_event.wait(self.flush_seconds):
            try:
                self.flush()
                self.forget_old(self.clock())
            except Exception:  # noqa: BLE001 - the history must never stop the exporter
                log.exception("history: unexpected error; carrying on")
        self.flush()

    def flush(self) -> bool:
        """Write what is pending in one transaction; False if the write failed."""
        return self.writer.flush()

    # -- what a snapshot adds (the publisher's thread) ------------------------------
    def observe(self, snapshot: Snapshot) -> None:
        """The snapshot's GPUs: new ones identified, the same ones' last-seen times."""
        with self.lock:
            self.gpus.observe(snapshot.identities, snapshot.driver_version, snapshot.time,
                              self.writer.batch, self.boot_id)

    # -- new XIDs (the sampler's XID sources: their sink) -----------------------------
    def write_xids(self, occurrences: Sequence[Occurrence], kmsg_cursor: int | None) -> None:
        """Count the sampler's new XIDs (each already counted once across both sources)
        and commit them, with the kernel log's cursor past them, before returning: a
        cursor moved over XIDs of the other source alone is committed too, or a restart
        would read them again and count them twice."""
        with self.writer.writing:
            with self.lock:
                for o in occurrences:
                    gpu = o.key or (self.gpus.in_slot(o.slot) if o.gpu is None else NODE)
                    if gpu is None:  # none here now nor stored for the slot (the ledger checks)
                        if o.count:
                            self.writer.refuse("not_on_this_node", o.what)
                        continue
                    if o.count:
                        self._xid(gpu, o.code, o.time, o.count)
                    self._seen_by(gpu, o)
                if kmsg_cursor is not None:
                    self.cursor = kmsg_cursor
                    self._store_cursor()
            if occurrences or kmsg_cursor is not None:
                self.writer.write_ahead()

    def refuse(self, reason: str, what: str) -> None:
        """An XID the sampler refused (its code, its slot): counted with the store's."""
        with self.lock:
            self.writer.refuse(reason, what)

    def _xid(self, gpu: GpuKey, code: int, at: float, count: int) -> None:
        """`count` new occurrences of an XID, added to the counter and the episode."""
        total = self.xids.setdefault((gpu, code), [0.0, 0.0])
        total[0] += count
        total[1] = max(total[1], at)
        self.writer.batch.counters[(*gpu, "xid", str(code))] = (total[0], total[1])
        self._occurred(gpu, "xid", at, code, count=count)

    def _seen_by(self, gpu: GpuKey, o: Occurrence) -> None:
        """Who saw the last XID of `o.code` on `gpu`: `o`'s source where `o` is (one of)
        it, or where it matched it, besides the other one."""
        total = self.xids.get((gpu, o.code))
        if total is None:
            return
        last = total[1]
        before = self.xid_seen_by.get((gpu, o.code))
        seen = int(before[0]) if before is not None and before[1] == last else 0
        if (o.count and o.time == last) or last in o.matched:
            seen |= _SOURCE[o.source]
        if seen and [seen, last] != before:
            self.xid_seen_by[(gpu, o.code)] = [seen, last]
            self.writer.batch.counters[(*gpu, "xid_source", str(o.code))] = (seen, last)

    def _occurred(self, gpu: GpuKey, kind: str, at: float, xid: int | None = None,
                  detail: str = "", count: int = 1) -> None:
        episode, new = self.merger.add(gpu, kind, at, xid, detail, count)
        self.writer.batch.episodes[id(episode)] = episode
        if new:
            self.recent.append(episode)
            self.version += 1

    def _level(self, gpu: GpuKey, name: str, value: float | None, at: float) -> bool:
        """Store a level (a check's state, 1 while it is bad); True when it rose since the
        last one seen. A check already bad at its first read is an episode: it says what
        the GPU needs now."""
        if value is None:
            return False
        previous = self.levels.get((gpu, name))
        if previous == value:
            return False
        self.levels[(gpu, name)] = value
        self.writer.batch.counters[(*gpu, "level", name)] = (value, at)
        if previous is None:
            return value > 0.0
        return value > previous

    # -- the health verdict (exporter.health) ---------------------------------------
    def observe_health(self, health: NodeHealth) -> None:
        """The snapshot's verdicts: a check of CHECK_KINDS turning warning or failed is an
        episode of its kind (a GPU lost, the `gpu_answering` check failed on it, is
        `gpu_lost`), and a GPU's (or the node's own checks') turn to failed a
        `health_failed` one. Stored as levels, so a restart that finds the same verdict
        adds none."""
        if health is self._last_health:
            return  # the monitor returns the same object while nothing changed
        self._last_health = health
        with self.lock:
            for gpu, verdict in health.gpus.items():
                key = self.gpus.key_of.get(gpu)
                if key is not None:
                    self._judged(key, verdict, health.time)
            self._judged(NODE, health.node, health.time)

    def _judged(self, key: GpuKey, verdict: Verdict, at: float) -> None:
        failed = any(c.state == FAILED for c in verdict.checks)
        if self._level(key, "verdict_failed", float(failed), at):
            self._occurred(key, "health_failed", at)
        for check in verdict.checks:
            kind = CHECK_KINDS.get(check.name)
            if kind is None:
                continue
            if check.name == "gpu_answering" and check.value == "lost":
                kind = "gpu_lost"
            # a check judged per port has an episode per port, as NVSentinel keeps them
            name = f"check {check.name}" + (f" {check.port}" if check.port else "")
            bad = check.state in (WARNING, FAILED)
            if self._level(key, name, float(bad), at):
                self._occurred(key, kind, at, detail=check.port)

    def _store_cursor(self) -> None:
        if self.boot_id and self.cursor >= 0:
            self.writer.batch.cursors[self.boot_id] = (self.cursor, self.clock())

    # -- what is served -------------------------------------------------------------
    def problems(self) -> list[str]:
        """Degraded states for /readyz."""
        with self.lock:
            out = [self._no_boot_id()] if self.reads_kernel_log and not self.boot_id else []
            if self.writer.problem:
                out.append(f"history: writes to {self.store.path} fail ({self.writer.problem});"
                           f" {len(self.writer.batch.episodes)} episodes kept in memory")
        return out

    def _no_boot_id(self) -> str:
        return (f"history: no boot id ({self.boot_id_path} cannot be read): the kernel log "
                "is read from this start on only, so XIDs it logged while the exporter was "
                "down are not counted")

    def stats(self) -> HistoryStats:
        with self.lock:
            w = self.writer
            return HistoryStats(w.transactions, w.write_failures, w.dropped,
                                dict(self.store.resets), len(self.gpus.replacements),
                                self.created, dict(w.refused.counts))

    def episodes_since(self, since: float) -> list[Episode]:
        with self.lock:
            return [e for e in self.recent if e.start >= since]

    def forget_old(self, now: float) -> None:
        """Drop episodes past the longest window from memory (the store keeps them)."""
        with self.lock:
            self.recent = [e for e in self.recent if e.start >= now - KEEP_SECONDS]
            self.merger.close_before(now)

