"""Profiling reading -> Prometheus metric families (``gpu_profiling_*``, the GPM ratios,
and per MIG GPU instance ``gpu_mig_*_ratio`` and ``gpu_mig_energy_joules_total``).

A MIG instance's activity is in ``gpu_mig_*`` twins of the whole-GPU families, labelled
``gpu, uuid, gpu_instance`` as ``gpu_mig_memory_*`` are, rather than in the same families
with a ``gpu_instance`` label: an instance's ratio is a share of its own SMs, not of the
GPU, and a family that mixed both would make every ``avg``/``max by (gpu)`` over the
whole-GPU families (the straggler and compute rules) count instances as GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.collectors.profiling.mig import IDLE_INSTANCE
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
    yield from mig_profiling_families(reading, snapshot, labels)


_MIG_LABELS = ["gpu", "uuid", "gpu_instance"]


def mig_profiling_families(reading: ProfilingReading, snapshot: Any,
                           labels: dict[int, list[str]]) -> Iterator[Metric]:
    ratios = {m.key: GaugeMetricFamily(
        "gpu_mig_" + m.metric.removeprefix("gpu_"),
        m.help.replace(", from GPM", " of the MIG GPU instance, from GPM"),
        labels=_MIG_LABELS) for m in gpm.MIG_METRICS}
    for (gpu, gi), interval in sorted(reading.instances.items()):
        if gpu in labels and snapshot.up(gpu):
            for key, value in interval.values.items():
                if key in ratios:
                    ratios[key].add_metric([*labels[gpu], str(gi)], value)
    energy = CounterMetricFamily(
        "gpu_mig_energy_joules", "The GPU's sampled energy split between its MIG GPU "
        "instances by activity (slices / 7 x SM activity); gpu_instance=\"idle\" holds the "
        "rest, so the parts add up to the GPU's energy since the split began.",
        labels=_MIG_LABELS)
    for gpu, split in sorted(reading.mig_energy.items()):
        if gpu not in labels or not snapshot.up(gpu):
            continue
        for gi, joules in sorted(split.instances.items()):
            energy.add_metric([*labels[gpu], str(gi)], joules)
        energy.add_metric([*labels[gpu], IDLE_INSTANCE], split.idle)
    for family in (*ratios.values(), energy):
        if family.samples:
            yield family


