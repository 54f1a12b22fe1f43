"""Host reading -> Prometheus metric families (``host_*``, ``cte_host_*``)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from exporter.collectors.host.reading import CALLS, HostReading
from exporter.families import Family

__all__ = ["DECLARED", "host_families"]

CPU_UTILIZATION = Family(
    "host_cpu_utilization_ratio", "gauge",
    "Busy share of all CPU time since the previous read (0-1).", unit="ratio",
    source="`psutil.cpu_times()` deltas")
CPUS = Family(
    "host_cpus", "gauge", "Logical CPUs (psutil.cpu_count).", source="`psutil.cpu_count()`",
    doc="Logical CPUs (named like `cte_gpus`: promtool rejects a `_count` suffix on a "
        "gauge).")
MEMORY_TOTAL = Family(
    "host_memory_total_bytes", "gauge", "Physical memory in total.", unit="bytes",
    source="`psutil.virtual_memory().total`")
MEMORY_USED = Family(
    "host_memory_used_bytes", "gauge", "Memory in use (psutil's used).", unit="bytes",
    source="`psutil.virtual_memory().used`",
    doc="Memory in use as psutil (and `free`) count it.")
MEMORY_AVAILABLE = Family(
    "host_memory_available_bytes", "gauge",
    "Memory available to new processes without swapping.", unit="bytes",
    source="`psutil.virtual_memory().available`",
    doc="Memory available to new processes without swapping (`MemAvailable`); the figure "
        "to alert on.")
LOADS = tuple(Family(f"host_load{window}", "gauge", f"{window}-minute load average.",
                     source="`psutil.getloadavg()`") for window in (1, 5, 15))


def _network(attr: str, unit: str, help_: str, psutil: str) -> tuple[str, Family]:
    return attr, Family(f"host_network_{attr}_total", "counter", help_, ("interface",),
                        unit=unit, source=f"`psutil.net_io_counters(pernic=True).{psutil}`")


# (the reading's attribute, its family)
NETWORK = (
    _network("receive_bytes", "bytes", "Bytes received on the interface.", "bytes_recv"),
    _network("transmit_bytes", "bytes", "Bytes sent on the interface.", "bytes_sent"),
    _network("receive_errors", "-", "Receive errors on the interface.", "errin"),
    _network("transmit_errors", "-", "Transmit errors on the interface.", "errout"),
    _network("receive_drops", "packets", "Received packets dropped.", "dropin"),
    _network("transmit_drops", "packets", "Packets dropped on transmit.", "dropout"),
)
READ_ERRORS = Family(
    "cte_host_read_errors_total", "counter",
    "psutil calls of the host source that failed, by call.", ("call",), source="exporter",
    doc="psutil calls of the host source that failed, by call (`cpu_times`, `cpu_count`, "
        "`virtual_memory`, `getloadavg`, `net_io_counters`).")

DECLARED = (CPU_UTILIZATION, CPUS, MEMORY_TOTAL, MEMORY_USED, MEMORY_AVAILABLE, *LOADS,
            *(declared for _, declared in NETWORK), READ_ERRORS)


def _gauge(family: Family, value: float | None) -> Iterator[GaugeMetricFamily]:
    if value is not None:
        yield family.gauge(value)


def host_families(reading: HostReading) -> Iterator[Metric]:
    """Metric families for one host reading (a part whose call failed is left out)."""
    yield from _gauge(CPU_UTILIZATION, reading.cpu_utilization_ratio)
    yield from _gauge(CPUS, reading.cpu_count)
    yield from _gauge(MEMORY_TOTAL, reading.memory_total_bytes)
    yield from _gauge(MEMORY_USED, reading.memory_used_bytes)
    yield from _gauge(MEMORY_AVAILABLE, reading.memory_available_bytes)
    if reading.load is not None:
        for family, value in zip(LOADS, reading.load, strict=True):
            yield from _gauge(family, value)

    for attr, declared in NETWORK:
        counter = declared.counter()
        for interface, counters in reading.network.items():
            counter.add_metric([interface], getattr(counters, attr))
        if counter.samples:
            yield counter

    yield READ_ERRORS.by_label(reading.errors_total, CALLS)
