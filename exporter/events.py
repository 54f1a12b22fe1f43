"""The fault-event vocabulary, shared by the node's history and the lemon score.

One event is one JSON object on one line (JSON Lines):

    {"time": <unix seconds>, "node": "...", "gpu": "<optional>", "kind": "...", "xid": <optional>}

`history --format jsonl` writes these; `lemons` reads them. `gpu` is absent for a node-level
event (a NIC, a PSU); `xid` is present only where the kind is `xid`. Pure: no I/O beyond the
reader, which names the file and line of anything it refuses.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from exporter.jsontext import loads

# Every kind, with what it means (docs/history.md lists them from here).
KINDS: dict[str, str] = {
    # GPU memory and bus
    "xid": "an XID the driver raised (the code in `xid`)",
    "ecc_dbe": "uncorrectable (double-bit) ECC errors",
    "ecc_sbe_storm": "a storm of correctable (single-bit) ECC errors",
    "row_remap_failure": "a row remap failed: the GPU needs service",
    "row_remap_pending": "a row remap waits for the next GPU reset",
    "retired_pages": "memory pages retired",
    "gpu_lost": "the GPU fell off the bus or stopped answering NVML",
    "gpu_unresponsive": "the GPU hung in NVML calls, or reported an unknown device error",
    "pcie_degraded": "the PCIe link runs below its maximum generation or width",
    "pcie_replays": "PCIe replays past the health threshold",
    # links and fabric
    "nvlink_errors": "NVLink errors past the health thresholds",
    "nvlink_degraded": "an NVLink that should be up is down",
    "fabric_degraded": "the NVLink fabric is not registered or reports degraded health",
    "ib_link_down": "an InfiniBand/RoCE port went down",
    "ib_degraded": "an InfiniBand/RoCE port runs below its rate or width, or counts link errors",
    "nic_lost": "a network adapter disappeared",
    # node and other
    "thermal": "thermal or power-brake slowdown, a fan or a cooling fault",
    "health_failed": "the health verdict turned failed",
    "other_gpu": "another GPU fault",
    "other_hardware": "another hardware fault (PSU, board, disk, memory, CPU)",
    "software": "a software or configuration fault",
    "unknown": "a fault of unknown cause",
}


class EventError(ValueError):
    """A line that is not an event: its message names what is wrong."""


@dataclass(frozen=True, slots=True)
class Event:
    time: float  # unix seconds
    node: str
    kind: str
    gpu: str | None = None
    xid: int | None = None

    def to_json(self) -> str:
        """The event's one JSON line (no newline); keys in the documented order."""
        obj: dict[str, object] = {"time": self.time, "node": self.node}
        if self.gpu is not None:
            obj["gpu"] = self.gpu
        obj["kind"] = self.kind
        if self.xid is not None:
            obj["xid"] = self.xid
        return json.dumps(obj, separators=(", ", ": "))


def parse_event(text: str) -> Event:
    """One event from one JSON line, or EventError saying what is wrong with it."""
    try:
        obj = loads(text)
    except json.JSONDecodeError as err:
        raise EventError(f"not JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(obj, dict):
        raise EventError("not a JSON object")
    time = obj.get("time")
    if isinstance(time, bool) or not isinstance(time, int | float) or not math.isfinite(time):
        raise EventError("'time' must be a finite number of unix seconds")
    node = obj.get("node")
    if not isinstance(node, str) or not node:
        raise EventError("'node' must be a non-empty string")
    kind = obj.get("kind")
    if kind not in KINDS:
        raise EventError(f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
    gpu = obj.get("gpu")
    if gpu is not None and not isinstance(gpu, str | int):
        raise EventError("'gpu' must be a string")
    xid = obj.get("xid")
    if xid is not None and (isinstance(xid, bool) or not isinstance(xid, int) or xid < 0):
        raise EventError("'xid' must be a non-negative integer")
    # interned: a fleet's file names a few thousand nodes and GPUs in millions of lines
    return Event(float(time), sys.intern(node), sys.intern(kind),
                 None if gpu is None else sys.intern(str(gpu)), xid)


def parse_lines(lines: Iterable[str]) -> Iterator[tuple[int, Event | EventError]]:
    """(line number, event or the error of that line) for each non-blank line."""
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                yield number, parse_event(line)
            except EventError as err:
                yield number, err
