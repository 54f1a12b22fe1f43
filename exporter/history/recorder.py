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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from exporter.health.model import FAILED, WARNING, NodeHealth, Verdict
from exporter.history import kmsg
from exporter.history.episodes import NODE, Episode, GpuKey, Merger
from exporter.history.matching import XidMatcher
from exporter.history.store import Batch, Loaded, Replacement, Store
from exporter.sampling.snapshot import Snapshot, XidRecord
from exporter.sampling.xids import valid_xid

log = logging.getLogger(__name__)

FLUSH_SECONDS = 5.0
POLL_SECONDS = 5.0  # the kernel log: NVML's events tell at once, the log is the fallback
WINDOW_SECONDS = {"1d": 86_400.0, "7d": 7 * 86_400.0, "28d": 28 * 86_400.0}
KEEP_SECONDS = WINDOW_SECONDS["28d"]
MAX_PENDING_EPISODES = 10_000  # held in memory while writes fail; the oldest go first
# Health checks whose turn to warning or failed is an episode of a kind (exporter/health);
# the others' kinds come from the values themselves (XIDs, ECC, remaps, NVLink errors).
CHECK_KINDS = {"pcie_replays": "pcie_replays", "pcie_link": "pcie_degraded",
               "nvlink_fabric": "fabric_degraded", "thermal_violation": "thermal",
               "power_violation": "thermal", "gpu_answering": "gpu_unresponsive"}
# NVSentinel's NIC monitor: any increase of these is a port in trouble (link_downed too,
# which is its own kind); rnr_nak_retry_err is a hw_counter
IB_LINK_ERRORS = ("excessive_buffer_overrun_errors", "local_link_integrity_errors",
                  "rnr_nak_retry_err")
IB_RECOVERY_PER_MINUTE = 5.0  # the monitor's link_error_recovery rate past which it warns
# Levels that are a GPU's state now rather than a count it gathered over its life: set the
# first time they are read, they are an episode (the others' first value is a baseline).
_FLAGS = frozenset({"row_remap_failure", "row_remap_pending"})
LAST_SEEN_SECONDS = 3600.0  # how often the GPUs' last-seen times are written (one row each)
# The kernel log is read in slices of this many records, the lock let go between them, so
# the publisher and a scrape wait at most one slice's work however long the log is.
KMSG_SLICE = 2_000
# Why a record is refused (cte_history_refused_records_total{reason}):
REFUSED_REASONS = ("xid_code", "not_on_this_node", "unstorable")
REFUSED_LOGGED = 10  # refusals named in the log per reason; the rest are counted only


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
    refused: dict[str, int]  # records refused, by reason (REFUSED_REASONS)


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
        # one write at a time, taken before `lock`: a write ahead of XIDs (under `lock`)
        # never runs beside a flush, nor commits before a flush that failed is taken back
        self.writing = threading.Lock()
        self.batch = Batch()
        self.merger = Merger()
        self.recent: list[Episode] = []
        self.version = 0  # bumped by each new episode (the families' cache key)
        self.xids: dict[tuple[GpuKey, int], list[float]] = {}  # -> [count, last seen]
        self.levels: dict[tuple[GpuKey, str], float] = {}
        self.slots: dict[str, tuple[str, str, float]] = {}
        self.replacements: list[Replacement] = []
        self.index_of: dict[GpuKey, int] = {}
        self.key_of: dict[int, GpuKey] = {}
        self._identities: object = None
        self._last_seen_written = 0.0
        self._identity_key: tuple | None = None
        self._xid_count = 0  # XIDs counted by this process (the continued counts' cache key)
        self._continued_cache: tuple | None = None
        self._last_health: NodeHealth | None = None
        self._seen_nvml: dict[tuple[int, int], int] = {}
        self._health: dict[int, object] = {}
        self._lost: frozenset[int] = frozenset()
        self._ib: object = None
        self._recoveries: dict[str, tuple[float, float]] = {}  # port -> count, time
        self.matcher = XidMatcher()
        self.refused: Counter[str] = Counter()
        self.cursor = -1
        self.created = 0.0
        self.transactions = self.write_failures = self.dropped = 0
        self.kmsg_xids = 0
        self.kmsg_problem = ""
        self.kmsg_readable: bool | None = None
        self.write_problem = ""
        self.identified = threading.Event()
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
            elif name == "level":
                self.levels[((serial, uuid), key)] = value
        for episode in loaded.episodes:
            self.merger.resume(episode)
            if episode.start >= self.clock() - KEEP_SECONDS:
                self.recent.append(episode)
        self.slots = dict(loaded.slots)
        self.replacements = loaded.replacements
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

    # -- writing -----------------------------------------------------------------
    def flush(self) -> bool:
        """Write what is pending in one transaction; False if the write failed (it is
        kept for the next one)."""
        with self.writing:
            with self.lock:
                batch, self.batch = self.batch, Batch()
            if not batch:
                return True
            refused, problem = self._write(batch)
            with self.lock:
                return self._settle(batch, refused, problem)

    def _write_ahead(self) -> None:
        """Commit what is pending now, new XIDs with it (the caller holds `writing` and
        `lock`): the counts are on disk before the lock lets a snapshot serve them."""
        batch, self.batch = self.batch, Batch()
        if batch:
            self._settle(batch, *self._write(batch))

    def _write(self, batch: Batch) -> tuple[list[str], str]:
        """(the rows the store refused, named; why the write failed, "" if it did not)."""
        try:
            return self.store.write(batch), ""
        except Exception as exc:  # noqa: BLE001 - any failure is counted, its batch kept
            return [], f"{type(exc).__name__}: {exc}"[:200]

    def _settle(self, batch: Batch, refused: list[str], problem: str) -> bool:
        """Count the write's outcome (under `lock`); a failed batch is taken back."""
        for what in refused:
            self._refuse("unstorable", what)
        if problem:
            self.write_failures += 1
            if not self.write_problem:
                log.warning("history: write failed (%s); keeping it in memory and "
                            "retrying", problem)
            self.write_problem = problem
            self.batch.absorb(batch)
            self._bound_pending()
            return False
        self.transactions += 1
        if self.write_problem:
            log.info("history: writes succeed again")
        self.write_problem = ""
        return True

    def _refuse(self, reason: str, what: str) -> None:
        """A record refused alone (under `lock`): counted, and named in one log line."""
        self.refused[reason] += 1
        if self.refused[reason] <= REFUSED_LOGGED:
            log.warning("history: refused %s (%s)%s", what, reason.replace("_", " "),
                        "; further ones are only counted" if self.refused[reason] ==
                        REFUSED_LOGGED else "")

    def _bound_pending(self) -> None:
        new = [k for k, e in self.batch.episodes.items() if e.id is None]
        for key in new[:max(0, len(new) - MAX_PENDING_EPISODES)]:
            del self.batch.episodes[key]
            self.dropped += 1

    # -- what a snapshot adds (the publisher's thread) ------------------------------
    def observe(self, snapshot: Snapshot) -> Snapshot:
        """Record what is new in the snapshot; the snapshot with continued XID counts. New
        XIDs are written before they are served (a write ahead, on this thread)."""
        fresh = any(r.count > self._seen_nvml.get(k, 0) for k, r in snapshot.xids.items())
        with self.writing if fresh else contextlib.nullcontext(), self.lock:
            if snapshot.identities is not self._identities and self._new_identities(snapshot):
                self._identify(snapshot)
            elif snapshot.time - self._last_seen_written >= LAST_SEEN_SECONDS:
                self._seen_now(snapshot)
            self._nvml_xids(snapshot)
            self._health_changes(snapshot)
            self._lost_gpus(snapshot)
            self._infiniband(snapshot)
            if fresh:
                self._write_ahead()
            if not self.xids and all(valid_xid(code) for _, code in snapshot.xids):
                return snapshot  # nothing to continue (a healthy node): serve it as it is
            xids = self._continued(snapshot)
        return dataclasses.replace(snapshot, xids=xids)

    def _new_identities(self, snapshot: Snapshot) -> bool:
        """Whether the GPUs are others than last time (the sampler may publish the same
        identities in a new tuple)."""
        key = tuple(None if i is None else (i.index, i.serial, i.uuid, i.pci_bus_id)
                    for i in snapshot.identities)
        self._identities = snapshot.identities
        if key == self._identity_key:
            return False
        self._identity_key = key
        return True

    def _identify(self, snapshot: Snapshot) -> None:
        now = snapshot.time
        self.index_of, self.key_of = {}, {}
        for identity in snapshot.identities:
            if identity is None:
                continue
            key: GpuKey = (identity.serial, identity.uuid)
            slot = kmsg.pci_slot(identity.pci_bus_id)
            self.index_of[key], self.key_of[identity.index] = identity.index, key
            self.batch.gpus[key] = (slot, now, now)
            self.batch.boots.add((*key, self.boot_id, snapshot.driver_version, now))
            stored = self.slots.get(slot)
            if stored is not None and _replaced(stored[:2], key):
                replacement = Replacement(now, slot, (stored[0], stored[1]), key)
                log.warning("history: GPU %d in slot %s was replaced: serial %s (%s) is now "
                            "serial %s (%s)", identity.index, slot, stored[0], stored[1], *key)
                self.replacements.append(replacement)
                self.batch.replacements.append(replacement)
            if stored is None or stored[:2] != key:
                self.slots[slot] = (*key, now)
                self.batch.slots[slot] = (*key, now)
        self._last_seen_written = now
        self.identified.set()

    def _seen_now(self, snapshot: Snapshot) -> None:
        self._last_seen_written = snapshot.time
        for identity in snapshot.identities:
            if identity is not None:
                key = (identity.serial, identity.uuid)
                # the upsert keeps a stored first_seen, but a row not written yet (the
                # batch _identify filled, unwritten while writes fail) needs its own
                first = self.batch.gpus.get(key, ("", snapshot.time, 0.0))[1]
                self.batch.gpus[key] = (kmsg.pci_slot(identity.pci_bus_id), first,
                                        snapshot.time)

    def _nvml_xids(self, snapshot: Snapshot) -> None:
        for (gpu, code), record in snapshot.xids.items():
            new = record.count - self._seen_nvml.get((gpu, code), 0)
            if new <= 0:
                continue
            self._seen_nvml[(gpu, code)] = record.count
            if not valid_xid(code):
                self._refuse("xid_code", f"NVML XID {code} on GPU {gpu}")
                continue
            self._xid(self.key_of.get(gpu, NODE), code, record.last_seen, "nvml", new)

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
        self.batch.counters[(*gpu, "xid", str(code))] = (total[0], total[1])
        self._occurred(gpu, "xid", at, code, count=remaining)

    def _occurred(self, gpu: GpuKey, kind: str, at: float, xid: int | None = None,
                  detail: str = "", count: int = 1) -> None:
        episode, new = self.merger.add(gpu, kind, at, xid, detail, count)
        self.batch.episodes[id(episode)] = episode
        if new:
            self.recent.append(episode)
            self.version += 1

    def _level(self, gpu: GpuKey, name: str, value: float | None, at: float,
               first_counts: bool = False) -> bool:
        """Store a level (a count, a flag); True when it rose since the last one seen.
        The first value seen for a GPU (a first start, a GPU just fitted) is a baseline:
        lifetime counts and ports still training at boot did not happen now. Flags that
        say what a GPU needs now (a remap failure, a verdict) pass `first_counts`: set the
        first time, they are an episode."""
        if value is None:
            return False
        previous = self.levels.get((gpu, name))
        if previous == value:
            return False
        self.levels[(gpu, name)] = value
        self.batch.counters[(*gpu, "level", name)] = (value, at)
        if previous is None:
            return first_counts and value > 0.0
        return value > previous

    def _health_changes(self, snapshot: Snapshot) -> None:
        for gpu, health in snapshot.health.items():
            if self._health.get(gpu) is health:
                continue
            self._health[gpu] = health
            key = self.key_of.get(gpu)
            if key is None:
                continue
            at = health.time
            dbe = health.ecc_errors.get(("uncorrected", "aggregate"),
                                        health.ecc_errors.get(("uncorrected", "volatile")))
            levels = {
                "ecc_dbe": dbe,
                "retired_pages": (sum(health.retired_pages.values())
                                  if health.retired_pages else None),
                "row_remap_failure": health.row_remap_failure,
                "row_remap_pending": health.row_remap_pending,
                "nvlink_errors": (sum(v for link in health.nvlinks for n, v in link.errors.items()
                                      if n in ("replay", "recovery")) if health.nvlinks else None),
                "nvlink_degraded": (float(sum(1 for link in health.nvlinks if link.up is False))
                                    if health.nvlinks else None),
            }
            for kind, value in levels.items():
                if self._level(key, kind, value, at, first_counts=kind in _FLAGS):
                    self._occurred(key, kind, at)

    def _lost_gpus(self, snapshot: Snapshot) -> None:
        if snapshot.lost == self._lost:
            return
        for gpu in snapshot.lost - self._lost:
            key = self.key_of.get(gpu)
            if key is not None:
                self._occurred(key, "gpu_lost", snapshot.time)
        self._lost = snapshot.lost

    def _infiniband(self, snapshot: Snapshot) -> None:
        result = snapshot.collectors.get("infiniband")
        reading = getattr(result, "reading", None)
        if reading is None or reading is self._ib:
            return
        self._ib = reading
        for device in getattr(reading, "devices", ()):
            for port in device.ports:
                detail = f"{device.name}/{port.port}"
                downed = port.counters.get("link_downed")
                if self._level(NODE, f"ib_link_downed {detail}", downed, snapshot.time):
                    self._occurred(NODE, "ib_link_down", snapshot.time, detail=detail)
                # a port first seen not ACTIVE (uncabled, training at boot) is a baseline:
                # an episode only when a port that was ACTIVE leaves it
                not_active = None if port.state_id is None else float(port.state_id != 4)
                if self._level(NODE, f"ib_not_active {detail}", not_active, snapshot.time):
                    self._occurred(NODE, "ib_link_down", snapshot.time, detail=detail)
                errors = [port.counters.get(n, port.hw_counters.get(n))
                          for n in IB_LINK_ERRORS]
                total = sum(e for e in errors if e is not None) if any(
                    e is not None for e in errors) else None
                # "ib_error_counts": the sum without link_error_recovery (a stored
                # "ib_link_errors" level held it, and would read as a fall)
                rose = self._level(NODE, f"ib_error_counts {detail}", total, snapshot.time)
                recovering = self._recovering(detail, port.counters.get("link_error_recovery"),
                                              snapshot.time)  # both keep their state
                if rose or recovering:
                    self._occurred(NODE, "ib_degraded", snapshot.time, detail=detail)

    def _recovering(self, port: str, count: float | None, at: float) -> bool:
        """Whether link_error_recovery ran past IB_RECOVERY_PER_MINUTE: more than that
        many since the reference reading, or that rate over a minute or more since it."""
        if count is None:
            return False
        reference = self._recoveries.get(port)
        if reference is None or count < reference[0]:  # the first reading, a reset
            self._recoveries[port] = (count, at)
            return False
        rose, elapsed = count - reference[0], at - reference[1]
        if rose > IB_RECOVERY_PER_MINUTE or elapsed >= 60.0:
            self._recoveries[port] = (count, at)
            return rose > IB_RECOVERY_PER_MINUTE * max(1.0, elapsed / 60.0)
        return False

    def _continued(self, snapshot: Snapshot) -> dict[tuple[int, int], XidRecord]:
        version = (self.version, self._xid_count, self._identity_key)
        if self._continued_cache is not None and self._continued_cache[0] == version and (
                self._continued_cache[1] == snapshot.xids):
            return self._continued_cache[2]
        # a GPU without identity keeps this process's count; a code outside NVML's range
        # is no label
        out = {k: r for k, r in snapshot.xids.items() if valid_xid(k[1])}
        for (gpu_key, code), (count, last) in self.xids.items():
            gpu = self.index_of.get(gpu_key, -1 if gpu_key == NODE else None)
            if gpu is not None:
                out[(gpu, code)] = XidRecord(int(count), last)
        self._continued_cache = (version, dict(snapshot.xids), out)
        return out

    # -- the health verdict (exporter.health) ---------------------------------------
    def observe_health(self, health: NodeHealth) -> None:
        """The snapshot's verdicts: a GPU's (or the node's own checks') turn to failed is a
        `health_failed` episode, a check of CHECK_KINDS turning warning or failed one of
        its kind. Stored as levels, so a restart that finds the same verdict adds none."""
        if health is self._last_health:
            return  # the monitor returns the same object while nothing changed
        self._last_health = health
        with self.lock:
            for gpu, verdict in health.gpus.items():
                key = self.key_of.get(gpu)
                if key is not None:
                    self._judged(key, verdict, health.time,
                                 any(c.state == FAILED for c in verdict.checks))
            self._judged(NODE, health.node, health.time,
                         any(c.state == FAILED for c in health.node.checks))

    def _judged(self, key: GpuKey, verdict: Verdict, at: float, failed: bool) -> None:
        if self._level(key, "verdict_failed", float(failed), at, first_counts=True):
            self._occurred(key, "health_failed", at)
        for check in verdict.checks:
            kind = CHECK_KINDS.get(check.name)
            if kind is not None and self._level(key, f"check {check.name}", float(
                    check.state in (WARNING, FAILED)), at, first_counts=True):
                self._occurred(key, kind, at)

    # -- the kernel log (the history's thread) --------------------------------------
    def poll_kmsg(self) -> None:
        """Take the log's XIDs not taken yet (once the GPUs are known), in slices of
        KMSG_SLICE records: each is parsed without the lock and its XIDs, with the
        cursor past them, written ahead in one transaction."""
        if (not self.reader.path or not self.identified.is_set()
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
            with self.writing, self.lock:
                if fresh:
                    self.cursor = max(cursor, max(r.sequence for r in fresh))
                for xid in xids:
                    self._kmsg_xid(xid)
                # written with the XIDs it covers, in their transaction; other records are
                # only read again after a restart (and skipped), so they cause no write
                if xids or (not more and self.stop_event.is_set()):
                    self._store_cursor()
                if xids:
                    self._write_ahead()

    def _kmsg_xid(self, xid: kmsg.KmsgXid) -> None:
        """One XID line, checked: a code in NVML's range, a slot of this node's GPUs."""
        self.kmsg_xids += 1
        code = xid.code if xid.code >= 0 else f"of more than {kmsg.MAX_CODE_DIGITS} digits"
        line = f"kernel log record {xid.sequence}: XID {code} in PCI slot {xid.pci}"
        if not valid_xid(xid.code):
            self._refuse("xid_code", line)
            return
        gpu = self._gpu_in(xid.pci)
        if gpu is None:
            self._refuse("not_on_this_node", line)
            return
        self._xid(gpu, xid.code, xid.time, "kmsg")

    def _store_cursor(self) -> None:
        if self.boot_id and self.cursor >= 0:
            self.batch.cursors[self.boot_id] = (self.cursor, self.clock())

    def _gpu_in(self, slot: str) -> GpuKey | None:
        """The GPU last seen in a PCI slot (the one there now: _identify keeps `slots`; else
        one that fell off the bus before we started), else None: not on this node."""
        stored = self.slots.get(slot)
        return (stored[0], stored[1]) if stored is not None else None

    # -- what is served -------------------------------------------------------------
    def problems(self) -> list[str]:
        """Degraded states for /readyz."""
        with self.lock:
            out = [self.kmsg_problem] if self.kmsg_problem else []
            if self.reader.path and not self.boot_id and self.kmsg_readable is not False:
                out.append(self._no_boot_id())
            if self.write_problem:
                out.append(f"history: writes to {self.store.path} fail ({self.write_problem});"
                           f" {len(self.batch.episodes)} episodes kept in memory")
        return out

    def _no_boot_id(self) -> str:
        return (f"history: no boot id ({self.boot_id_path} cannot be read): the kernel log "
                "is read from this start on only, so XIDs it logged while the exporter was "
                "down are not counted")

    def stats(self) -> HistoryStats:
        with self.lock:
            return HistoryStats(self.transactions, self.write_failures, self.dropped,
                                dict(self.store.resets), self.matcher.duplicates, self.kmsg_xids,
                                self.kmsg_readable, len(self.replacements), self.created,
                                dict(self.refused))

    def episodes_since(self, since: float) -> list[Episode]:
        with self.lock:
            return [e for e in self.recent if e.start >= since]

    def forget_old(self, now: float) -> None:
        """Drop episodes past the longest window from memory (the store keeps them)."""
        with self.lock:
            self.recent = [e for e in self.recent if e.start >= now - KEEP_SECONDS]
            self.merger.close_before(now)


def _replaced(old: tuple[str, str], new: GpuKey) -> bool:
    """A different GPU in the slot: its serial differs (its UUID, where a GPU reports
    no serial)."""
    if old[0] and new[0]:
        return old[0] != new[0]
    return old[1] != new[1]
