"""XIDs from the kernel log, on the sampling side: a loop (every POLL_SECONDS) that takes
the log's records not taken yet, in slices of SLICE records, and hands each slice's XIDs
to the ledger with the cursor past them (sampling/xid_ledger.py), so the history writes
both in one transaction.

Where the log starts: after the record the store says this boot's last start took (XIDs
logged while the exporter was down are counted), or, without a state directory or a boot
id to keep a cursor by, at the log's end at start (each start would otherwise count the
ring's XIDs again): a log line says which, and why.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping

from exporter.sampling import kmsg
from exporter.sampling.xid_ledger import Occurrence, XidLedger

log = logging.getLogger(__name__)

POLL_SECONDS = 5.0  # NVML's events tell at once, the log is the fallback
# Records are parsed a slice at a time: a long log holds the ledger (and, through the
# write ahead, the history's lock) at most one slice's work at a time.
SLICE = 2_000


class KernelLogFollower:
    def __init__(self, path: str, ledger: XidLedger, slots: Callable[[], Mapping[str, int]],
                 boot_time: Callable[[], float] = kmsg.boot_time):
        """`slots`: the PCI slot (DDDD:BB:DD) of each GPU here now -> its index."""
        self.path, self.ledger, self.slots, self.boot_time = path, ledger, slots, boot_time
        self.reader = kmsg.KmsgReader(path)
        self.cursor = -1  # the last record taken (the sequence restarts at boot)
        self.xids = 0  # XID lines read, refused ones too
        self._skipped_said: dict[str, int] = {}  # the reader's skipped records, as logged
        self.readable: bool | None = None  # None: not tried yet
        self.problem = ""

    def begin(self, cursor: int | None, from_end_because: str) -> None:
        """Take the records after `cursor`; None: only those logged from now on."""
        self.reader.close()
        self.reader = kmsg.KmsgReader(self.path, from_end=cursor is None)
        self._skipped_said = {}
        self.cursor = -1 if cursor is None else cursor
        if cursor is None:
            log.info("kernel log %s read from its end (%s): XIDs it logged before this "
                     "start are not counted", self.path, from_end_because)
            with contextlib.suppress(OSError):  # tick() says why
                self.reader.open()  # now: what is logged from here on is taken

    def tick(self) -> None:
        """Hand the ledger the XIDs logged since the last tick, a slice at a time."""
        if self.readable is False:
            return
        boot = self.boot_time()
        more = True
        while more:
            try:
                records, more = self.reader.read_slice(SLICE)
            except OSError as exc:
                self.readable = False
                self.problem = (
                    f"kernel log {self.path} cannot be read ({exc.strerror or exc}): XIDs "
                    "come from NVML events only; it needs CAP_SYSLOG where "
                    "kernel.dmesg_restrict=1 (docs/history.md)")
                log.warning("%s", self.problem)
                return
            self.readable = True
            self._say_skipped()
            fresh = [r for r in records if r.sequence > self.cursor]
            if not fresh:
                continue
            cursor = max(r.sequence for r in fresh)
            xids = [x for x in (kmsg.parse_xid(r, boot) for r in fresh) if x is not None]
            if xids:  # the cursor goes with the XIDs it covers; other records cause no write
                self.xids += len(xids)
                slots = self.slots()
                self.ledger.add([_occurrence(x, slots) for x in xids], cursor)
            self.cursor = cursor  # past them once they are counted (add may raise)

    @property
    def skipped(self) -> int:
        """Records skipped whole (too long, or numbered past 64 bits)."""
        return sum(self.reader.skipped.values())

    def _say_skipped(self) -> None:
        """One log line for each reason the last read skipped records for."""
        for reason, count in self.reader.skipped.items():
            new = count - self._skipped_said.get(reason, 0)
            if new:
                self._skipped_said[reason] = count
                log.warning("kernel log %s: %d record(s) %s skipped whole (%d since start)",
                            self.path, new, reason, count)

    def finish(self) -> None:
        """A last read, and the cursor kept (the sampler has stopped)."""
        self.tick()
        if self.readable:
            self.ledger.add([], self.cursor)
        self.reader.close()


def _occurrence(xid: kmsg.KmsgXid, slots: Mapping[str, int]) -> Occurrence:
    code = xid.code if xid.code >= 0 else f"of more than {kmsg.MAX_CODE_DIGITS} digits"
    return Occurrence(slots.get(xid.pci), xid.code, xid.time, "kmsg", slot=xid.pci,
                      what=f"kernel log record {xid.sequence}: XID {code} in PCI slot {xid.pci}")
