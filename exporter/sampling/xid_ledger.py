"""The XIDs a snapshot serves: what both sources report (NVML's events, sampling/xids.py;
the kernel log, sampling/xid_kmsg.py), each XID counted once (xid_matching.py), on top of
the counts the node's store held at start.

New XIDs go to the sink first: where a state directory is kept it is the history, which
commits them before `add` returns (a write ahead), so no count is served that a restart
could take back. The counts are then replaced whole, never changed in place: the
publisher takes them without a lock, and a slow disk holds the XID's own thread, never a
snapshot or a scrape. Without a state directory nothing is written, and the counts start
from zero with the process.

Every occurrence is checked before it reaches a count or a label: an XID code outside
NVML's range and a kernel-log XID for a PCI slot where this node has no GPU (nor, by the
store, ever had) are refused alone, told to the sink, and named in a log line.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from exporter.sampling.snapshot import XidRecord
from exporter.sampling.xid_matching import XidMatcher

log = logging.getLogger(__name__)

# NVML's XID codes: an event's eventData is the code, 999 where the driver does not know it
# (REFERENCE: nvmlEventSetWait). Anything else is no XID, and never a label.
MAX_XID = 999
REFUSED_LOGGED = 10  # refusals named in the log per reason; the rest are counted only
NO_STATE_DIRECTORY = "no state directory is kept"
GpuKey = tuple[str, str]  # a GPU's serial and UUID: who it is, whatever its index


def valid_xid(code: int) -> bool:
    """Whether `code` is an XID code in NVML's range (1 to MAX_XID)."""
    return 1 <= code <= MAX_XID


@dataclass(frozen=True)
class Occurrence:
    """One source's report of an XID: `count` occurrences of `code`, the last at `time`."""

    gpu: int | None  # its index now; -1: NVML's event named no GPU we know; None: see slot
    code: int
    time: float  # Unix seconds
    source: str  # "nvml" or "kmsg"
    count: int = 1
    slot: str = ""  # the PCI slot the kernel log names (DDDD:BB:DD); "" for NVML's
    what: str = ""  # how a refusal's log line names it
    key: GpuKey | None = None  # the GPU's (serial, UUID), where it is identified
    # the times of the other source's reports of the same XIDs this one matched (its
    # `count` is then what is new: 0 where it only confirmed XIDs already counted)
    matched: tuple[float, ...] = ()

    @property
    def matched_as(self) -> object:
        """What the two sources' reports of one XID share: the GPU, or its slot."""
        return self.gpu if self.gpu is not None else self.slot


@dataclass(frozen=True)
class XidStart:
    """What the store hands the sampler at start."""

    counts: Mapping[tuple[int, int], XidRecord] = field(default_factory=dict)  # (gpu, code)
    # the stored counts of GPUs not identified at start (lost then), by code: served once
    # the GPU is identified, so its count never falls below what an earlier run served
    later: Mapping[GpuKey, Mapping[int, XidRecord]] = field(default_factory=dict)
    # PCI slots of GPUs the node had before and has no longer: their kernel-log XIDs are
    # stored (the lemon score counts them), not served
    former_slots: frozenset[str] = frozenset()
    kmsg_cursor: int | None = None  # the last kernel-log record taken this boot, -1 none
    # None above: the log is read from its end, and this says why
    kmsg_from_end: str = NO_STATE_DIRECTORY
    # (gpu, code) -> the time of the GPU's and code's last XID where NVML reported it and
    # its log line had not been read: the line, read only after this start, is that XID
    waiting: Mapping[tuple[int, int], float] = field(default_factory=dict)


class XidSink(Protocol):
    def write_xids(self, occurrences: Sequence[Occurrence], kmsg_cursor: int | None) -> None:
        """Keep the new XIDs (and the kernel log's cursor past them) before they are
        served; an occurrence's `matched` says which counted XIDs the other source has
        now reported too."""

    def refuse(self, reason: str, what: str) -> None:
        """An occurrence refused alone (`reason`: xid_code, not_on_this_node)."""


class Refusals:
    """Records refused alone, counted by reason, the first REFUSED_LOGGED of each named."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def add(self, reason: str, what: str) -> None:
        self.counts[reason] += 1
        if self.counts[reason] <= REFUSED_LOGGED:
            log.warning("refused %s (%s)%s", what, reason.replace("_", " "),
                        "; further ones are only counted"
                        if self.counts[reason] == REFUSED_LOGGED else "")


class Unstored:
    """The sink where no state directory is kept: nothing written, refusals logged."""

    def __init__(self) -> None:
        self.refusals = Refusals()

    def write_xids(self, occurrences: Sequence[Occurrence], kmsg_cursor: int | None) -> None:
        pass

    def refuse(self, reason: str, what: str) -> None:
        self.refusals.add(reason, what)


class XidLedger:
    def __init__(self, keys: Callable[[], Mapping[int, GpuKey]] = dict) -> None:
        """`keys`: each identified GPU's index -> its (serial, UUID), for the sink."""
        self.keys = keys
        self.matcher = XidMatcher()
        self._adding = threading.Lock()  # one source's report at a time, sink included
        self.sink: XidSink = Unstored()
        self.former_slots: frozenset[str] = frozenset()
        self._counts: dict[tuple[int, int], XidRecord] = {}

    def begin(self, start: XidStart, sink: XidSink | None) -> None:
        """Continue from the store's counts, writing to `sink` (before sampling starts)."""
        with self._adding:
            self.sink = sink if sink is not None else Unstored()
            self.former_slots = start.former_slots
            self._counts = dict(start.counts)
            # A GPU's and code's last stored XID that NVML reported and the log had not
            # yet (the exporter stopped between the event and the log's next read), as if
            # NVML had just reported it: its log line, read after this start, matches it
            # instead of counting again. XIDs the log had reported wait for nothing.
            self.matcher = XidMatcher()
            for (gpu, code), at in start.waiting.items():
                self.matcher.new(gpu, code, at, "nvml", 1)

    @property
    def duplicates(self) -> int:
        """XIDs both sources reported, counted once."""
        return self.matcher.duplicates

    def add(self, occurrences: Sequence[Occurrence], kmsg_cursor: int | None = None) -> None:
        """Count what is new of `occurrences`, the sink keeping it first."""
        with self._adding:
            new: list[Occurrence] = []
            for o in occurrences:
                if not valid_xid(o.code):
                    self.sink.refuse("xid_code", o.what or f"XID {o.code} on GPU {o.gpu}")
                elif o.gpu is None and o.slot not in self.former_slots:
                    self.sink.refuse("not_on_this_node", o.what or f"XID in slot {o.slot}")
                else:
                    remaining, matched = self.matcher.match(o.matched_as, o.code, o.time,
                                                            o.source, o.count)
                    if remaining or matched:  # the sink keeps which source saw what
                        new.append(dataclasses.replace(o, count=remaining,
                                                       matched=tuple(matched)))
            if new:
                keys = self.keys()
                new = [dataclasses.replace(o, key=keys.get(o.gpu)) if o.gpu is not None
                       else o for o in new]
            if new or kmsg_cursor is not None:
                self.sink.write_xids(new, kmsg_cursor)
            served = [((o.gpu, o.code), o) for o in new if o.gpu is not None and o.count]
            if served:
                counts = dict(self._counts)
                for key, o in served:
                    before = counts.get(key, XidRecord(0, 0.0))
                    counts[key] = XidRecord(before.count + o.count, max(before.last_seen, o.time))
                self._counts = counts  # replaced whole: a snapshot holds the one it took

    def continue_from(self, gpu: int, stored: Mapping[int, XidRecord]) -> None:
        """A GPU identified late: its stored counts, by code, under this process's."""
        with self._adding:
            counts = dict(self._counts)
            for code, record in stored.items():
                now = counts.get((gpu, code), XidRecord(0, 0.0))
                counts[(gpu, code)] = XidRecord(now.count + record.count,
                                                max(now.last_seen, record.last_seen))
            self._counts = counts

    def close(self) -> None:
        """Nothing more goes to the sink (the store closes; an event thread NVML's wait
        still holds reports to no one)."""
        with self._adding:
            self.sink = Unstored()

    def seen(self) -> Mapping[tuple[int, int], XidRecord]:
        """Every XID counted, by (GPU, code): the store's counts and this process's."""
        return self._counts
