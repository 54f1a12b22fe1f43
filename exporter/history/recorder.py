"""The live history: what each snapshot and the kernel log add, kept in memory and
written to the store by one thread in batches (at most one transaction every
FLUSH_SECONDS, none when nothing happened).

XIDs are written ahead: the thread that sees new XIDs (the publisher for NVML's, the
history's thread for the kernel log's) commits them, with all that is pending, before it
lets go of the lock, so a count is on disk before any snapshot serves it and a restart
never continues from below what was served. A burst is one transaction.

The publisher thread calls `observe(snapshot)` and serves the snapshot it returns: its
XID counts are the stored totals plus what came since, so `gpu_xid_errors_total`
continues across restarts. An XID seen both by NVML's events and in the kernel log
within MATCH_SECONDS (exporter/history/matching.py) counts once.

Every record is checked before it reaches the store or a label: an XID code outside
NVML's range, a kernel-log XID for a PCI slot where this node never had a GPU, and a row
the store cannot hold are refused alone, counted by reason (`refused`) and named in a log
line; the batch around them is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from exporter.health.model import FAILED, WARNING, CheckResult, NodeHealth, Verdict
from exporter.history import kmsg
from exporter.history.episodes import NODE, Episode, GpuKey, Merger
from exporter.history.identities import GpuIdentities
from exporter.history.matching import XidMatcher
from exporter.history.store import Loaded, Store
from exporter.history.writer import Writer
from exporter.sampling.snapshot import Snapshot, XidRecord
from exporter.sampling.xids import valid_xid

log = logging.getLogger(__name__)

FLUSH_SECONDS = 5.0
POLL_SECONDS = 5.0  # the kernel log: NVML's events tell at once, the log is the fallback
WINDOW_SECONDS = {"1d": 86_400.0, "7d": 7 * 86_400.0, "28d": 28 * 86_400.0}
KEEP_SECONDS = WINDOW_SECONDS["28d"]
# The history judges nothing: a check of the verdict (exporter/health/) turning warning or
# failed is an episode of its kind, so a threshold changed in the health settings moves the
# history with the verdict. XIDs are events, recorded as they come; a failed verdict is a
# `health_failed` episode besides.
CHECK_KINDS = {"ecc_uncorrected": "ecc_dbe", "retired_pages": "retired_pages",
               "retired_pages_recent": "retired_pages", "retired_pages_pending": "retired_pages",
               "row_remap_failure": "row_remap_failure", "row_remap_pending": "row_remap_pending",
               "remapped_rows": "row_remap_pending",
               "nvlink_errors": "nvlink_errors", "nvlink_links": "nvlink_degraded",
               "pcie_replays": "pcie_replays", "pcie_link": "pcie_degraded",
               "nvlink_fabric": "fabric_degraded", "thermal_violation": "thermal",
               "power_violation": "thermal", "gpu_answering": "gpu_unresponsive",
               "infiniband_ports": "ib_link_down", "infiniband_link_errors": "ib_degraded"}
# the node's checks whose value names the ports: an episode per port, as NVSentinel keeps them
PER_PORT = frozenset({"infiniband_ports", "infiniband_link_errors"})
# The kernel log is read in slices of this many records, the lock let go between them, so
# the publisher and a scrape wait at most one slice's work however long the log is.
KMSG_SLICE = 2_000


@dataclass(frozen=True)
class HistoryStats:
    transactions: int
    write_failures: int
    dropped: int
    resets: dict[str, int]
    duplicates: int  # XIDs both sources saw, counted once
    kmsg_xids: int
    kmsg_readable: bool | None  # None: not tried yet
    replacements: int
    created: float
    refused: dict[str, int]  # records refused, by reason (writer.REFUSED_REASONS)


class History:
    def __init__(self, store: Store, node: str, *, clock: Callable[[], float] = time.time,
                 kmsg_path: str = kmsg.KMSG, boot_id_path: str = kmsg.BOOT_ID,
                 boot_time: Callable[[], float] = kmsg.boot_time,
                 flush_seconds: float = FLUSH_SECONDS, poll_seconds: float = POLL_SECONDS):
        self.store, self.node, self.clock = store, node, clock
        self.boot_id = kmsg.read_boot_id(boot_id_path)
        self.boot_id_path = boot_id_path
        # without a boot id no cursor can be stored: read only what is logged from now on,
        # or each start would count the ring's XIDs again
        self.reader = kmsg.KmsgReader(kmsg_path, from_end=not self.boot_id)
        self.boot_time = boot_time
        self.flush_seconds, self.poll_seconds = flush_seconds, poll_seconds
        self.lock = threading.Lock()
        self.writer = Writer(store, self.lock)
        self.merger = Merger()
        self.recent: list[Episode] = []
        self.version = 0  # bumped by each new episode (the families' cache key)
        self.xids: dict[tuple[GpuKey, int], list[float]] = {}  # -> [count, last seen]
        self.levels: dict[tuple[GpuKey, str], float] = {}
        self.gpus = GpuIdentities()
        self._xid_count = 0  # XIDs counted by this process (the continued counts' cache key)
        self._continued_cache: tuple | None = None
        self._last_health: NodeHealth | None = None
        self._seen_nvml: dict[tuple[int, int], int] = {}
        self.matcher = XidMatcher()
        self.cursor = -1
        self.created = 0.0
        self.kmsg_xids = 0
        self.kmsg_problem = ""
        self.kmsg_readable: bool | None = None
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None

    @property
    def duplicates(self) -> int:
        """XIDs both sources saw, counted once."""
        return self.matcher.duplicates

    # -- start and stop -----------------------------------------------------------
    def load(self) -> None:
        """Read what the store holds (the store is open)."""
        loaded: Loaded = self.store.load(self.clock() - KEEP_SECONDS)
        self.created = loaded.created
        for (serial, uuid, name, key), (value, last) in loaded.counters.items():
            if name == "xid":
                self.xids[((serial, uuid), int(key))] = [value, last]
            elif name == "level" and (key == "verdict_failed" or key.startswith("check ")):
                # a check's state (levels of older versions' own rules are left unread)
                self.levels[((serial, uuid), key)] = value
        for episode in loaded.episodes:
            self.merger.resume(episode)
            if episode.start >= self.clock() - KEEP_SECONDS:
                self.recent.append(episode)
        self.gpus.slots = dict(loaded.slots)
        self.gpus.replacements = loaded.replacements
        self.cursor = loaded.cursors.get(self.boot_id, -1) if self.boot_id else -1
        self.store.set_node(self.node)
        if self.reader.path and not self.boot_id:
            log.warning("history: %s", self._no_boot_id())
            with contextlib.suppress(OSError):  # poll_kmsg() says why it cannot be read
                self.reader.open()  # now: what is logged from here on is taken

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="cte-history", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Read the log once more, write what is pending, close the store."""
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=30)
            self.thread = None
        else:
            self.poll_kmsg()
            self.flush()
        self.reader.close()
        self.store.close()

    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_seconds
        while not self.stop_event.wait(self.poll_seconds):
            try:
                self.poll_kmsg()
                if time.monotonic() >= next_flush:
                    self.flush()
                    self.forget_old(self.clock())
                    next_flush = time.monotonic() + self.flush_seconds
            except Exception:  # noqa: BLE001 - the history must never stop the exporter
                log.exception("history: unexpected error; carrying on")
        self.poll_kmsg()
        self.flush()

    def flush(self) -> bool:
        """Write what is pending in one transaction; False if the write failed."""
        return self.writer.flush()

    # -- what a snapshot adds (the publisher's thread) ------------------------------
    def observe(self, snapshot: Snapshot) -> Snapshot:
        """Record what is new in the snapshot; the snapshot with continued XID counts. New
        XIDs are written before they are served (a write ahead, on this thread)."""
        fresh = any(r.count > self._seen_nvml.get(k, 0) for k, r in snapshot.xids.items())
        with self.writer.writing if fresh else contextlib.nullcontext(), self.lock:
            self.gpus.observe(snapshot, self.writer.batch, self.boot_id)
            self._nvml_xids(snapshot)
            if fresh:
                self.writer.write_ahead()
            if not self.xids and all(valid_xid(code) for _, code in snapshot.xids):
                return snapshot  # nothing to continue (a healthy node): serve it as it is
            xids = self._continued(snapshot)
        return dataclasses.replace(snapshot, xids=xids)

    def _nvml_xids(self, snapshot: Snapshot) -> None:
        for (gpu, code), record in snapshot.xids.items():
            new = record.count - self._seen_nvml.get((gpu, code), 0)
            if new <= 0:
                continue
            self._seen_nvml[(gpu, code)] = record.count
            if not valid_xid(code):
                self.writer.refuse("xid_code", f"NVML XID {code} on GPU {gpu}")
                continue
            self._xid(self.gpus.key_of.get(gpu, NODE), code, record.last_seen, "nvml", new)

    def _xid(self, gpu: GpuKey, code: int, at: float, source: str, count: int = 1) -> None:
        """`count` occurrences of an XID from one source, less those the other source
        already reported (within MATCH_SECONDS), added to the counter and the episode in
        one step."""
        remaining = self.matcher.new(gpu, code, at, source, count)
        if remaining == 0:
            return
        self._xid_count += remaining
        total = self.xids.setdefault((gpu, code), [0.0, 0.0])
        total[0] += remaining
        total[1] = max(total[1], at)
        self.writer.batch.counters[(*gpu, "xid", str(code))] = (total[0], total[1])
        self._occurred(gpu, "xid", at, code, count=remaining)

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

    def _continued(self, snapshot: Snapshot) -> dict[tuple[int, int], XidRecord]:
        version = (self.version, self._xid_count, self.gpus.key)
        if self._continued_cache is not None and self._continued_cache[0] == version and (
                self._continued_cache[1] == snapshot.xids):
            return self._continued_cache[2]
        # a GPU without identity keeps this process's count; a code outside NVML's range
        # is no label
        out = {k: r for k, r in snapshot.xids.items() if valid_xid(k[1])}
        for (gpu_key, code), (count, last) in self.xids.items():
            gpu = self.gpus.index_of.get(gpu_key, -1 if gpu_key == NODE else None)
            if gpu is not None:
                out[(gpu, code)] = XidRecord(int(count), last)
        self._continued_cache = (version, dict(snapshot.xids), out)
        return out

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
            for subject, bad in self._subjects(key, check).items():
                name = f"check {check.name}" + (f" {subject}" if subject else "")
                if self._level(key, name, float(bad), at):
                    self._occurred(key, kind, at, detail=subject)

    def _subjects(self, key: GpuKey, check: CheckResult) -> dict[str, bool]:
        """What a check's episodes are about, and whether each is bad now: "" for a GPU's
        check; for a node check of PER_PORT, each port its value names (the InfiniBand link
        errors name "port counter" pairs) and each port it named before, now ok."""
        bad = check.state in (WARNING, FAILED)
        if check.name not in PER_PORT:
            return {"": bad}
        words = str(check.value).split() if bad else []
        named = set(words[0::2] if check.name == "infiniband_link_errors" else words)
        prefix = f"check {check.name} "
        before = {name[len(prefix):] for k, name in self.levels
                  if k == key and name.startswith(prefix)}
        return {port: port in named for port in sorted(named | before)}

    # -- the kernel log (the history's thread) --------------------------------------
    def poll_kmsg(self) -> None:
        """Take the log's XIDs not taken yet (once the GPUs are known), in slices of
        KMSG_SLICE records: each is parsed without the lock and its XIDs, with the
        cursor past them, written ahead in one transaction."""
        if (not self.reader.path or not self.gpus.identified.is_set()
                or self.kmsg_readable is False):
            return
        boot = self.boot_time()
        more = True
        while more:
            try:
                records, more = self.reader.read_slice(KMSG_SLICE)
            except OSError as exc:
                with self.lock:
                    self.kmsg_readable = False
                    self.kmsg_problem = (
                        f"kernel log {self.reader.path} cannot be read ({exc.strerror or exc}):"
                        " XIDs come from NVML events only; it needs CAP_SYSLOG where "
                        "kernel.dmesg_restrict=1 (docs/history.md)")
                    log.warning("history: %s", self.kmsg_problem)
                return
            self.kmsg_readable = True
            cursor = self.cursor  # only this thread moves it
            fresh = [r for r in records if r.sequence > cursor]
            xids = [x for x in (kmsg.parse_xid(r, boot) for r in fresh) if x is not None]
            with self.writer.writing, self.lock:
                if fresh:
                    self.cursor = max(cursor, max(r.sequence for r in fresh))
                for xid in xids:
                    self._kmsg_xid(xid)
                # written with the XIDs it covers, in their transaction; other records are
                # only read again after a restart (and skipped), so they cause no write
                if xids or (not more and self.stop_event.is_set()):
                    self._store_cursor()
                if xids:
                    self.writer.write_ahead()

    def _kmsg_xid(self, xid: kmsg.KmsgXid) -> None:
        """One XID line, checked: a code in NVML's range, a slot of this node's GPUs."""
        self.kmsg_xids += 1
        code = xid.code if xid.code >= 0 else f"of more than {kmsg.MAX_CODE_DIGITS} digits"
        line = f"kernel log record {xid.sequence}: XID {code} in PCI slot {xid.pci}"
        if not valid_xid(xid.code):
            self.writer.refuse("xid_code", line)
            return
        gpu = self.gpus.in_slot(xid.pci)
        if gpu is None:
            self.writer.refuse("not_on_this_node", line)
            return
        self._xid(gpu, xid.code, xid.time, "kmsg")

    def _store_cursor(self) -> None:
        if self.boot_id and self.cursor >= 0:
            self.writer.batch.cursors[self.boot_id] = (self.cursor, self.clock())

    # -- what is served -------------------------------------------------------------
    def problems(self) -> list[str]:
        """Degraded states for /readyz."""
        with self.lock:
            out = [self.kmsg_problem] if self.kmsg_problem else []
            if self.reader.path and not self.boot_id and self.kmsg_readable is not False:
                out.append(self._no_boot_id())
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
                                dict(self.store.resets), self.matcher.duplicates, self.kmsg_xids,
                                self.kmsg_readable, len(self.gpus.replacements), self.created,
                                dict(w.refused))

    def episodes_since(self, since: float) -> list[Episode]:
        with self.lock:
            return [e for e in self.recent if e.start >= since]

    def forget_old(self, now: float) -> None:
        """Drop episodes past the longest window from memory (the store keeps them)."""
        with self.lock:
            self.recent = [e for e in self.recent if e.start >= now - KEEP_SECONDS]
            self.merger.close_before(now)

