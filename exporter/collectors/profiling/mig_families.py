"""Profiling reading -> the per MIG GPU instance families: ``gpu_mig_*_ratio`` and
``gpu_mig_energy_joules_total`` (docs/metrics.md shows them under MIG).

A MIG instance's activity is in ``gpu_mig_*`` twins of the whole-GPU families, labelled
``gpu, uuid, gpu_instance`` as ``gpu_mig_memory_*`` are, rather than in the same families
with a ``gpu_instance`` label: an instance's ratio is a share of its own SMs, not of the
GPU, and a family that mixed both would make every ``avg``/``max by (gpu)`` over the
whole-GPU families (the straggler and compute rules) count instances as GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from exporter.collectors.mig.families import INSTANCE_LABELS
from exporter.collectors.profiling.mig import IDLE_INSTANCE
from exporter.collectors.profiling.reading import ProfilingReading
from exporter.families import Family
from exporter.gpu import gpm

__all__ = ["DECLARED", "mig_profiling_families"]

_GPM = "present only when a GPU is in MIG mode and has GPM"
# GPM key -> (its NVML_GPM_METRIC_ constant, the docs' description)
_DOCS = {
    "graphics_engine_active_ratio": (
        "GRAPHICS_UTIL", "Share of time the GPU instance's graphics/compute engine had work "
        f"({_GPM}, from one interval after start)."),
    "sm_active_ratio": (
        "SM_UTIL", "Share of time an SM of the GPU instance had a warp resident, averaged "
        f"over its SMs ({_GPM})."),
    "sm_occupancy_ratio": (
        "SM_OCCUPANCY", f"Resident warps as a share of the instance's SMs' maximum ({_GPM})."),
    "tensor_active_ratio": (
        "ANY_TENSOR_UTIL", f"Share of time the instance's tensor pipes were busy ({_GPM})."),
    "dram_active_ratio": (
        "DRAM_BW_UTIL", "The instance's memory bandwidth in use as a share of its maximum "
        f"({_GPM})."),
}


def _ratio(metric: gpm.GpmMetric) -> Family:
    constant, doc = _DOCS[metric.key]
    return Family(
        "gpu_mig_" + metric.metric.removeprefix("gpu_"), "gauge",
        metric.help.replace(", from GPM", " of the MIG GPU instance, from GPM"),
        INSTANCE_LABELS, unit="ratio",
        source=f"`nvmlGpmMigSampleGet`, `nvmlGpmMetricsGet(NVML_GPM_METRIC_{constant})`",
        doc=doc)


#: GPM key -> the family of its ratio per GPU instance (name and help from gpm.METRICS)
RATIOS: dict[str, Family] = {m.key: _ratio(m) for m in gpm.MIG_METRICS}
ENERGY = Family(
    "gpu_mig_energy_joules_total", "counter",
    "The GPU's sampled energy split between its MIG GPU instances by activity (slices / 7 x "
    "SM activity); gpu_instance=\"idle\" holds the rest, so the parts add up to the GPU's "
    "energy since the split began.", INSTANCE_LABELS, unit="J",
    source="the GPU's sampled energy, split by `gpu_mig_sm_active_ratio`",
    doc="The GPU's energy attributed to each GPU instance (slices / 7 x SM activity); "
        "`gpu_instance=\"idle\"` holds the rest, so per GPU the series add up to its energy "
        f"since the split began ({_GPM}).")

DECLARED = (*RATIOS.values(), ENERGY)


def mig_profiling_families(reading: ProfilingReading, snapshot: Any,
                           labels: dict[int, list[str]]) -> Iterator[Metric]:
    ratios: dict[str, GaugeMetricFamily] = {k: f.gauge() for k, f in RATIOS.items()}
    for (gpu, gi), interval in sorted(reading.instances.items()):
        if gpu in labels and snapshot.up(gpu):
            for key, value in interval.values.items():
                if key in ratios:
                    ratios[key].add_metric([*labels[gpu], str(gi)], value)
    energy = ENERGY.counter()
    for gpu, split in sorted(reading.mig_energy.items()):
        if gpu not in labels or not snapshot.up(gpu):
            continue
        for gi, joules in sorted(split.instances.items()):
            energy.add_metric([*labels[gpu], str(gi)], joules)
        energy.add_metric([*labels[gpu], IDLE_INSTANCE], split.idle)
    for family in (*ratios.values(), energy):
        if family.samples:
            yield family
