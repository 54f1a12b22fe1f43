"""Host reading -> Prometheus metric families (``host_*``, ``cte_host_*``)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.collectors.host.reading import CALLS, HostReading
from exporter.collectors.registry import counts_by

__all__ = ["host_families"]

_NETWORK = (
    ("receive_bytes", "host_network_receive_bytes", "Bytes received on the interface."),
    ("transmit_bytes", "host_network_transmit_bytes", "Bytes sent on the interface."),
    ("receive_errors", "host_network_receive_errors", "Receive errors on the interface."),
    ("transmit_errors", "host_network_transmit_errors", "Transmit errors on the interface."),
    ("receive_drops", "host_network_receive_drops", "Received packets dropped."),
    ("transmit_drops", "host_network_transmit_drops", "Packets dropped on transmit."),
)


def _gauge(name: str, help_: str, value: float | None) -> Iterator[Metric]:
    if value is not None:
        yield GaugeMetricFamily(name, help_, value=value)


def host_families(reading: HostReading) -> Iterator[Metric]:
    """Metric families for one host reading (a part whose call failed is left out)."""
    yield from _gauge("host_cpu_utilization_ratio",
                      "Busy share of all CPU time since the previous read (0-1).",
                      reading.cpu_utilization_ratio)
    yield from _gauge("host_cpus", "Logical CPUs (psutil.cpu_count).", reading.cpu_count)
    yield from _gauge("host_memory_total_bytes", "Physical memory in total.",
                      reading.memory_total_bytes)
    yield from _gauge("host_memory_used_bytes", "Memory in use (psutil's used).",
                      reading.memory_used_bytes)
    yield from _gauge("host_memory_available_bytes",
                      "Memory available to new processes without swapping.",
                      reading.memory_available_bytes)
    if reading.load is not None:
        for window, value in zip((1, 5, 15), reading.load, strict=True):
            yield from _gauge(f"host_load{window}", f"{window}-minute load average.", value)

    for attr, name, help_ in _NETWORK:
        family = CounterMetricFamily(name, help_, labels=["interface"])
        for interface, counters in reading.network.items():
            family.add_metric([interface], getattr(counters, attr))
        if family.samples:
            yield family

    yield counts_by("cte_host_read_errors", "psutil calls of the host source that failed, "
                    "by call.", "call", CALLS, reading.errors_total)
