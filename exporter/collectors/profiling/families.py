"""Profiling reading -> Prometheus metric families (``gpu_profiling_*``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.collectors.profiling.reading import ProfilingReading
from exporter.gpu import gpm


def profiling_families(reading: ProfilingReading, snapshot: Any) -> Iterator[Metric]:
    labels = {i.index: [str(i.index), i.uuid] for i in snapshot.identities if i is not None}
    supported = GaugeMetricFamily(
        "gpu_profiling_supported", "1 where the GPU gives GPM profiling metrics; 0 with the "
        "reason where not (unsupported_device: before Hopper; unsupported_driver; "
        "no_permission: e.g. MIG mode; error).", labels=["gpu", "uuid", "reason"])
    window = GaugeMetricFamily(
        "gpu_profiling_window_seconds", "Time the profiling ratios are averaged over (between "
        "the two GPM samples).", labels=["gpu", "uuid"])
    ratios = {m.key: GaugeMetricFamily(m.metric, m.help, labels=["gpu", "uuid"])
              for m in gpm.METRICS}
    for gpu, profile in sorted(reading.gpus.items()):
        if gpu not in labels or not snapshot.up(gpu):  # lost or hung: no stale series
            continue
        supported.add_metric([*labels[gpu], profile.status],
                             1.0 if profile.status == gpm.SUPPORTED else 0.0)
        interval = profile.reading
        if interval is None:
            continue
        window.add_metric(labels[gpu], interval.end - interval.start)
        for key, value in interval.values.items():
            ratios[key].add_metric(labels[gpu], value)
    yield supported
    yield window
    yield from ratios.values()


