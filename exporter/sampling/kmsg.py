"""XIDs from the kernel log (`/dev/kmsg`): the records, the driver's XID lines in them,
and a non-blocking reader that starts at the oldest record (or, `from_end`, after the
newest) and follows the log.

A record is `PRIORITY,SEQUENCE,TIMESTAMP_US,FLAGS[,...];MESSAGE` (the kernel's
Documentation/ABI/testing/dev-kmsg), followed by continuation lines that start with a
space. Each read() of the device returns one record; EAGAIN means none is left, EPIPE
that the ring overwrote records since the last read. The sequence restarts at boot,
which `/proc/sys/kernel/random/boot_id` names. Tests give a regular file instead of the
device: it is read the same way, line by line, from where the last read stopped.

A record the reader cannot take whole is skipped whole and counted (`skipped`, by reason):
one longer than MAX_RECORD (the device refuses it to our buffer; a file's line is dropped
to its end, so no tail of it is ever read as a record of its own), and one whose sequence
or stamp is past 64 bits (no store holds such a cursor, and a cursor there would pass
every later record).

NVIDIA's driver writes `NVRM: Xid (PCI:DDDD:BB:DD): CODE, pid=PID, name=NAME, TEXT`
(older drivers `NVRM: Xid (DDDD:BB:DD): CODE, ...`, newer ones `pid='<unknown>'`;
NVIDIA's "XID Errors" guide). Only kernel records (facility 0) count: anyone may write
a user-facility line that says the same.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections import Counter, deque
from dataclasses import dataclass

KMSG = "/dev/kmsg"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
MAX_RECORD = 8192  # the kernel's records are shorter (CONSOLE_EXT_LOG_MAX)
MAX_RECORDS_PER_READ = 20_000  # a ring holds a few thousand; stop a runaway loop
MAX_CODE_DIGITS = 18  # a code this long is already no XID; int() refuses past 4,300
FILE_CHUNK = 65536  # a regular file (tests) is read this much at a time
MAX_NUMBER = 2**63 - 1  # a record's sequence and stamp: what SQLite's INTEGER holds
# why a record was skipped whole (KmsgReader.skipped)
TOO_LONG = f"longer than {MAX_RECORD} bytes"
PAST_64_BITS = "numbered past 64 bits"

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})"
                  r"(?:\.[0-7])?\): (\d+)(?:,|$)")


@dataclass(frozen=True)
class Record:
    sequence: int
    monotonic_us: int  # since boot
    facility: int
    message: str


@dataclass(frozen=True)
class KmsgXid:
    sequence: int
    time: float  # unix seconds (boot time plus the record's timestamp)
    pci: str  # DDDD:BB:DD, lower case, as pci_slot() writes it
    code: int  # -1: more than MAX_CODE_DIGITS digits (no XID: the recorder refuses it)


def parse_record(text: str) -> Record | None:
    """One /dev/kmsg record (its first line); None for anything else."""
    head, sep, message = text.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 4:
        return None
    try:
        priority, sequence, stamp = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    if priority < 0 or sequence < 0 or stamp < 0:
        return None
    return Record(sequence, stamp, priority >> 3, message.split("\n", 1)[0].rstrip("\r"))


def pci_slot(bus_id: str) -> str:
    """DDDD:BB:DD for a PCI address, as NVML (`00000000:17:00.0`) or the driver's log
    (`0000:17:00`) writes it: the slot the GPU sits in."""
    text = bus_id.strip().lower().removeprefix("pci:")
    parts = text.split(":")
    if len(parts) < 3:
        return text
    domain, bus, device = parts[-3], parts[-2], parts[-1].split(".")[0]
    try:
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"
    except ValueError:
        return text


def parse_xid(record: Record, boot_time: float) -> KmsgXid | None:
    """The XID a kernel record reports, or None (another module, a user's line)."""
    if record.facility != 0:
        return None
    match = _XID.match(record.message.lstrip())
    if match is None:
        return None
    domain, bus, device, code = match.groups()
    return KmsgXid(record.sequence, boot_time + record.monotonic_us / 1e6,
                   pci_slot(f"{domain}:{bus}:{device}"),
                   int(code) if len(code) <= MAX_CODE_DIGITS else -1)


def read_boot_id(path: str = BOOT_ID) -> str:
    """This boot's id; "" where it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(64).strip()
    except OSError:
        return ""


def boot_time() -> float:
    """Unix seconds at boot, as the kernel log's timestamps count from it."""
    return time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)


class KmsgReader:
    """Reads records without ever blocking: the device record by record, a regular
    file (tests) line by line from where it stopped."""

    def __init__(self, path: str = KMSG, from_end: bool = False):
        self.path = path
        self.from_end = from_end  # skip the records logged before open()
        self.fd: int | None = None
        self.regular = False
        self._partial = b""
        self._skipping = False  # dropping the rest of a file's line too long to take
        self._lines: deque[bytes] = deque()  # a file's lines read, not yet parsed
        self.overwritten = 0  # times the ring overwrote records before we read them
        self.skipped: Counter[str] = Counter()  # records skipped whole, by reason

    def open(self) -> None:
        """Raises OSError (EPERM/EACCES without CAP_SYSLOG under dmesg_restrict)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self.regular = stat.S_ISREG(os.fstat(fd).st_mode)
        if self.from_end:
            os.lseek(fd, 0, os.SEEK_END)  # the device: past the newest record
        self.fd = fd

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def read(self) -> list[Record]:
        """Every record not read yet; raises OSError when the log cannot be read."""
        out: list[Record] = []
        for _ in range(MAX_RECORDS_PER_READ):
            records, more = self.read_slice(MAX_RECORDS_PER_READ - len(out))
            out += records
            if not more or len(out) >= MAX_RECORDS_PER_READ:
                break
        return out

    def read_slice(self, limit: int) -> tuple[list[Record], bool]:
        """Up to about `limit` records not read yet, and whether more may wait; raises
        OSError when the log cannot be read."""
        if self.fd is None:
            self.open()
        assert self.fd is not None
        if self.regular:
            return self._read_file(limit)
        return self._read_device(limit)

    def _read_device(self, limit: int) -> tuple[list[Record], bool]:
        out: list[Record] = []
        assert self.fd is not None
        for _ in range(limit):
            try:
                data = os.read(self.fd, MAX_RECORD)
            except BlockingIOError:
                return out, False
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten: the next read goes on
                    self.overwritten += 1
                    continue
                if exc.errno == errno.EINVAL:  # a record larger than our buffer
                    self.skipped[TOO_LONG] += 1
                    continue
                raise
            if not data:
                return out, False
            self._take(data, out)
        return out, True

    def _take(self, data: bytes, out: list[Record]) -> None:
        """The record `data` holds, onto `out`, unless it is none or cannot be taken."""
        record = parse_record(data.decode("utf-8", errors="replace"))
        if record is None:
            return
        if record.sequence > MAX_NUMBER or record.monotonic_us > MAX_NUMBER:
            self.skipped[PAST_64_BITS] += 1
            return
        out.append(record)

    def _read_file(self, limit: int) -> tuple[list[Record], bool]:
        assert self.fd is not None
        at_end = False
        while len(self._lines) < limit and not at_end:
            data = os.read(self.fd, FILE_CHUNK)
            at_end = not data
            if self._skipping:  # the rest of a line too long to take, up to its end
                end = data.find(b"\n")
                if end < 0:
                    continue
                data, self._skipping = data[end + 1:], False
            lines = (self._partial + data).split(b"\n")
            self._partial = lines.pop()  # an unfinished last line waits for the rest
            if len(self._partial) > MAX_RECORD:  # no record is that long: drop it whole
                self._partial, self._skipping = b"", True
                self.skipped[TOO_LONG] += 1
            self._lines.extend(lines)
        out: list[Record] = []
        while self._lines and len(out) < limit:
            line = self._lines.popleft()
            if line[:1] in (b" ", b"\t"):  # a continuation (dictionary) line
                continue
            if len(line) > MAX_RECORD:  # longer than the device would hand over
                self.skipped[TOO_LONG] += 1
                continue
            self._take(line, out)
        return out, bool(self._lines) or not at_end
