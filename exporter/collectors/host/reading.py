"""A few host figures through psutil: CPU, memory, load, per-interface network counters.

Only what the dashboards next to training use (node_exporter covers the rest). The
arithmetic is pure (:func:`cpu_busy_ratio`, :func:`keep_interface`); :class:`HostCollector`
does the psutil calls, each on its own: one call that fails (a platform without load
average, a ``/proc`` file that cannot be read) leaves that part out and is counted by
call name, the rest of the reading still stands.

CPU utilization is the busy share of all CPU time between two reads (psutil's own
definition: everything but ``idle`` and ``iowait``; ``guest`` time is already inside
``user``). The first read only takes the baseline and reports no utilization.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import psutil

__all__ = [
    "CALLS",
    "DEFAULT_NETWORK_EXCLUDE",
    "MAX_INTERFACES",
    "CpuTimes",
    "HostReading",
    "HostCollector",
    "InterfaceCounters",
    "cpu_busy_ratio",
    "keep_interface",
]

log = logging.getLogger(__name__)

#: Loopback and the virtual interfaces of containers, VMs and CNI plugins.
DEFAULT_NETWORK_EXCLUDE = r"^(lo|docker.*|veth.*|virbr.*|cni.*|flannel.*|cali.*)$"

#: At most this many interfaces are exported (sorted by name), so labels stay bounded.
MAX_INTERFACES = 64

#: The psutil calls a read makes (the ``call`` label of the error self-metric).
CALLS = ("cpu_times", "cpu_count", "virtual_memory", "getloadavg", "net_io_counters")


@dataclass(frozen=True)
class CpuTimes:
    """Whole-machine CPU seconds: ``busy`` and ``total`` (all CPUs together)."""

    busy: float
    total: float

    @classmethod
    def from_psutil(cls, times: Any) -> CpuTimes:
        fields = times._asdict()
        # On Linux guest and guest_nice are already counted in user and nice.
        total = sum(fields.values()) - fields.get("guest", 0.0) - fields.get("guest_nice", 0.0)
        idle = fields.get("idle", 0.0) + fields.get("iowait", 0.0)
        return cls(busy=total - idle, total=total)


def cpu_busy_ratio(before: CpuTimes, after: CpuTimes) -> float | None:
    """Busy share of the CPU time between two readings, 0-1; ``None`` if it cannot tell."""
    total = after.total - before.total
    busy = after.busy - before.busy
    if total <= 0:  # no time passed at the counters' resolution, or they went back
        return None
    return min(1.0, max(0.0, busy / total))


def keep_interface(name: str, exclude: re.Pattern[str]) -> bool:
    """Whether a network interface is exported (it does not match the exclude pattern)."""
    return exclude.search(name) is None


@dataclass(frozen=True)
class InterfaceCounters:
    receive_bytes: float
    transmit_bytes: float
    receive_errors: float
    transmit_errors: float
    receive_drops: float
    transmit_drops: float


@dataclass(frozen=True)
class HostReading:
    """``None`` (or empty) where the call that provides it failed or had nothing yet."""

    cpu_utilization_ratio: float | None = None
    cpu_count: int | None = None
    memory_total_bytes: float | None = None
    memory_used_bytes: float | None = None
    memory_available_bytes: float | None = None
    load: tuple[float, float, float] | None = None
    network: Mapping[str, InterfaceCounters] = field(default_factory=dict)
    #: Cumulative failed psutil calls by call name since the source was created.
    errors_total: Mapping[str, int] = field(default_factory=dict)


class HostCollector:
    """Reads the host figures through ``ps`` (the psutil module; tests hand in a stand-in)."""

    name = "host"

    def __init__(self, network_exclude: str = DEFAULT_NETWORK_EXCLUDE, ps: Any = psutil,
                 max_interfaces: int = MAX_INTERFACES) -> None:
        self._ps = ps
        self._exclude = re.compile(network_exclude)
        self._max_interfaces = max_interfaces
        self._previous: CpuTimes | None = None
        self._errors: dict[str, int] = dict.fromkeys(CALLS, 0)
        self._lock = threading.Lock()
        self._warned_truncation = False

    def read(self) -> HostReading:
        with self._lock:  # the CPU baseline is per source: one read at a time
            failed: list[str] = []

            def call(name: str, *args: Any, **kwargs: Any) -> Any:
                try:
                    return getattr(self._ps, name)(*args, **kwargs)
                except Exception as exc:  # one failed call leaves out only its part
                    log.debug("psutil.%s failed: %s", name, exc)
                    failed.append(name)
                    return None

            ratio = None
            times = call("cpu_times")
            if times is not None:
                now = CpuTimes.from_psutil(times)
                if self._previous is not None:
                    ratio = cpu_busy_ratio(self._previous, now)
                self._previous = now
            count = call("cpu_count", logical=True)
            memory = call("virtual_memory")
            load = call("getloadavg")
            nics = call("net_io_counters", pernic=True)
            for name in failed:
                self._errors[name] = self._errors.get(name, 0) + 1
            errors = MappingProxyType(dict(self._errors))
        return HostReading(
            cpu_utilization_ratio=ratio,
            cpu_count=int(count) if count else None,
            memory_total_bytes=float(memory.total) if memory is not None else None,
            memory_used_bytes=float(memory.used) if memory is not None else None,
            memory_available_bytes=float(memory.available) if memory is not None else None,
            load=(float(load[0]), float(load[1]), float(load[2])) if load else None,
            network=MappingProxyType(self._interfaces(nics or {})),
            errors_total=errors,
        )

    def _interfaces(self, nics: Mapping[str, Any]) -> dict[str, InterfaceCounters]:
        names = sorted(n for n in nics if keep_interface(n, self._exclude))
        if len(names) > self._max_interfaces:
            if not self._warned_truncation:
                log.warning("%d network interfaces; exporting the first %d by name "
                            "(tune --collector.host.network-exclude)", len(names),
                            self._max_interfaces)
                self._warned_truncation = True
            names = names[: self._max_interfaces]
        return {
            n: InterfaceCounters(
                receive_bytes=float(c.bytes_recv),
                transmit_bytes=float(c.bytes_sent),
                receive_errors=float(c.errin),
                transmit_errors=float(c.errout),
                receive_drops=float(c.dropin),
                transmit_drops=float(c.dropout),
            )
            for n in names
            for c in (nics[n],)
        }
