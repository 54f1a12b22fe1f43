"""InfiniteHBD-Trace (StepFun, SIGCOMM 2025) to our fault events.

The trace is a JSON list of `{"node_id", "event_time" (days since its first event),
"event_type": "fault_start" | "fault_end", "fault_type": {"Level", "Class", "Desc"}}`.
Each `fault_start` becomes one event (an episode); `fault_end` has no event of its own.
`DESC_KINDS` is the one mapping: docs/health.md shows it and a test keeps the two equal;
a pair it lacks falls back to its Class's kind (`CLASS_KINDS`), then its Level's.
It is keyed by Class and Desc, because one Desc ("Unknown Error") sits under three
classes that mean different things (a failed stress test, software, nothing known).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from exporter.events import KINDS, Event
from exporter.jsontext import loads

# Day 0 of the trace (it gives days since its first event, no dates): 2024-01-01 00:00 UTC.
EPOCH = 1704067200
DAY = 86400.0

# (Class, Desc) -> (kind, why). Every pair the trace uses is here.
DESC_KINDS: dict[tuple[str, str], tuple[str, str]] = {
    ("GPU", "GPU DBE(Double Bit ECC) > Threshold"): ("ecc_dbe", "uncorrectable ECC errors"),
    ("GPU", "GPU SBE(Single Bit ECC) > Threshold"): ("ecc_sbe_storm",
                                                     "correctable ECC errors past a threshold"),
    ("GPU", "GPU Lost"): ("gpu_lost", "the GPU fell off the bus"),
    ("GPU", "GPU device unknow error"): ("gpu_unresponsive", "an unknown device error"),
    ("GPU", "nvidia-smi Timeout"): ("gpu_unresponsive", "the GPU hung in NVML calls"),
    ("GPU", "GPU PCI link width low"): ("pcie_degraded", "the GPU's PCIe link is narrower"),
    ("GPU", "GPU xid Error"): ("xid", "an XID (the trace gives no code)"),
    ("GPU", "GPU Temperature High"): ("thermal", "a GPU too hot"),
    ("GPU", "GPU P2P Bandwidth Low"): ("other_gpu",
                                       "GPU-to-GPU bandwidth low (NVLink or PCIe: not said)"),
    ("NIC", "NIC Link Speed low"): ("ib_degraded", "a network port below its rate"),
    ("NIC", "NIC PCI link Width low"): ("ib_degraded", "a network adapter's PCIe link narrower"),
    ("NIC", "NIC Lost"): ("nic_lost", "a network adapter disappeared"),
    ("Parameter Plane Cable", "Link Down"): ("ib_link_down",
                                             "a port of the training network went down"),
    ("Change", "Y-cables Taken offline"): ("ib_link_down",
                                           "a planned change took the node's cables offline"),
    ("Fan", "Speed Critical (Sensor)"): ("thermal", "a fan at critical speed"),
    ("Fan", "Redundancy Lost"): ("thermal", "a fan lost its redundancy"),
    ("Power Supply", "Power Supply Failure detected"): ("other_hardware", "a power supply failed"),
    ("Motherboard Battery", "Low"): ("other_hardware", "the board's battery is low"),
    ("Stress Test Failure", "Unknown Error"): ("health_failed", "a stress test failed"),
    ("System Crash", "Server down"): ("unknown", "the server went down, cause not said"),
    ("Unknown Error", "Unknown Error"): ("unknown", "a fault of unknown cause"),
    ("File System", "FS: Multiple Disk FS Error"): ("software", "file system errors"),
    ("Software Tool", "Kubelet Date Absent"): ("software", "the kubelet's data is missing"),
    ("Other Failures", "Unknown Error"): ("software", "a software fault of unknown cause"),
}
# A (Class, Desc) the table does not know takes its Class's kind (the generic kind for
# what the Class names; `Change`, a planned change of any sort: unknown), or, for a Class
# it does not know either, its Level's: a later cut of the trace may bring Descs this one
# lacks. The converter names each such pair on standard error.
CLASS_KINDS: dict[str, str] = {
    "GPU": "other_gpu", "NIC": "ib_degraded", "Parameter Plane Cable": "ib_link_down",
    "Fan": "thermal", "Power Supply": "other_hardware", "Motherboard Battery": "other_hardware",
    "Stress Test Failure": "health_failed", "System Crash": "unknown",
    "Unknown Error": "unknown", "File System": "software", "Software Tool": "software",
    "Other Failures": "software", "Change": "unknown",
}
LEVEL_KINDS: dict[str, str] = {"Hardware Failure": "other_hardware",
                               "Software Failure": "software"}
assert all(kind in KINDS for kind, _ in DESC_KINDS.values())
assert all(kind in KINDS for kind in (*CLASS_KINDS.values(), *LEVEL_KINDS.values()))


def kind_of(level: str, cls: str, desc: str) -> str:
    """The kind of a fault: the table's, else its Class's, else its Level's, else
    `unknown`."""
    known = DESC_KINDS.get((cls, desc))
    if known is not None:
        return known[0]
    return CLASS_KINDS.get(cls) or LEVEL_KINDS.get(level, "unknown")


class TraceFormatError(ValueError):
    """A record the converter cannot read: the message names its index and what is wrong."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One record of the trace, its time in unix seconds."""

    node: str
    time: float
    start: bool
    level: str
    cls: str
    desc: str

    @property
    def kind(self) -> str:
        return kind_of(self.level, self.cls, self.desc)

    @property
    def in_table(self) -> bool:
        """Whether DESC_KINDS names its Class and Desc (else its kind is a fallback's)."""
        return (self.cls, self.desc) in DESC_KINDS

    def event(self) -> Event:
        return Event(self.time, self.node, self.kind)


def read_faults(records: Iterable[object]) -> Iterator[Fault]:
    """The trace's records in its order; TraceFormatError for one that is not a record."""
    for index, rec in enumerate(records):
        try:
            kind = rec["event_type"]  # type: ignore[index]
            fault = rec["fault_type"]  # type: ignore[index]
            out = Fault(str(rec["node_id"]), EPOCH + float(rec["event_time"]) * DAY,  # type: ignore[index]
                        kind == "fault_start", fault["Level"], fault["Class"], fault["Desc"])
        except (KeyError, TypeError, ValueError) as err:
            raise TraceFormatError(f"record {index}: not a fault record ({err!r})") from None
        if kind not in ("fault_start", "fault_end"):
            raise TraceFormatError(f"record {index}: event_type {kind!r}")
        yield out


def faults_of(records: object) -> list[Fault]:
    """Every record of the trace's list, sorted by time (stable: the list's order on ties)."""
    if not isinstance(records, list):
        raise TraceFormatError("not a JSON list")
    return sorted(read_faults(records), key=lambda x: x.time)


def load_faults(path: str | Path) -> list[Fault]:
    """Every record of the trace file, sorted by time (stable: the file's order on ties)."""
    with open(path, encoding="utf-8") as f:
        return faults_of(loads(f.read()))


def fallback_notes(faults: Iterable[Fault]) -> list[str]:
    """One line for each Class and Desc the table lacks: its count and the kind it took."""
    fallbacks = Counter((f.cls, f.desc, f.kind) for f in faults if f.start and not f.in_table)
    return [f"Class {cls!r}, Desc {desc!r} is not in the table: {count} fault(s) as {kind!r}, "
            "its Class's kind" for (cls, desc, kind), count in sorted(fallbacks.items())]


def to_events(faults: Iterable[Fault]) -> list[Event]:
    """One event per fault start, in time order."""
    return [f.event() for f in faults if f.start]
