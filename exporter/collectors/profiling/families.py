"""Profiling reading -> Prometheus metric families (``gpu_profiling_*`` and the GPM ratios
of whole GPUs; those of MIG GPU instances are in mig_families).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from exporter.collectors.profiling.mig_families import mig_profiling_families
from exporter.collectors.profiling.reading import ProfilingReading
from exporter.families import MINIMAL, STANDARD, Family
from exporter.gpu import gpm

__all__ = ["DECLARED", "profiling_families"]

_GPU = ("gpu", "uuid")
_PRESENT = " (present only when GPM is supported, from one interval after start)"

SUPPORTED = Family(
    "gpu_profiling_supported", "gauge",
    "1 where the GPU gives GPM profiling metrics; 0 with the reason where not "
    "(unsupported_device: before Hopper; unsupported_driver; no_permission: e.g. MIG mode; "
    "error).", (*_GPU, "reason"), source="`nvmlGpmQueryDeviceSupport`, `nvmlGpmSampleGet`",
    doc="1 with `reason=\"supported\"` where the GPU gives GPM metrics; 0 where not, with the "
        "reason: `unsupported_device` (before Hopper), `unsupported_driver` (no GPM symbols "
        "in the driver or bindings), `no_permission` (e.g. MIG mode without administrator "
        "rights), `error` (another error; asked again).")
WINDOW = Family(
    "gpu_profiling_window_seconds", "gauge",
    "Time the profiling ratios are averaged over (between the two GPM samples).", _GPU,
    unit="s", source="sampler",
    doc="Time the profiling ratios average over: between their two GPM samples "
        f"(`--collector.profiling.interval`).{_PRESENT}")

# GPM key -> (its NVML_GPM_METRIC_ constant, profile, the docs' description)
_DOCS = {
    "graphics_engine_active_ratio": (
        "GRAPHICS_UTIL", STANDARD, "Share of time the graphics/compute engine had work: any "
        "kernel resident, busy-waiting in a collective included. The closest to "
        "`gpu_utilization_ratio`, but averaged over the whole interval rather than sampled."),
    "sm_active_ratio": (
        "SM_UTIL", MINIMAL, "Share of time an SM had at least one warp resident, averaged "
        "over all SMs: a kernel on a few SMs (NCCL) reads low here while "
        "`gpu_utilization_ratio` reads 100 %."),
    "sm_occupancy_ratio": (
        "SM_OCCUPANCY", STANDARD, "Resident warps as a share of the SMs' maximum, averaged "
        "over time and SMs. Low occupancy is normal for large matmuls (few, heavy warps)."),
    "tensor_active_ratio": (
        "ANY_TENSOR_UTIL", MINIMAL, "Share of time the tensor pipes were busy (any "
        "precision), averaged over SMs: the compute share of a training job."),
    "dram_active_ratio": (
        "DRAM_BW_UTIL", STANDARD,
        "Device-memory bandwidth in use as a share of the maximum."),
    "fp64_active_ratio": (
        "FP64_UTIL", STANDARD,
        "Share of time the FP64 (non-tensor) pipes were busy, averaged over SMs."),
    "fp32_active_ratio": (
        "FP32_UTIL", STANDARD,
        "Share of time the FP32 (non-tensor) pipes were busy, averaged over SMs."),
    "fp16_active_ratio": (
        "FP16_UTIL", STANDARD,
        "Share of time the FP16 (non-tensor) pipes were busy, averaged over SMs."),
}


def _ratio(metric: gpm.GpmMetric) -> Family:
    constant, profile, doc = _DOCS[metric.key]
    return Family(metric.metric, "gauge", metric.help, _GPU, unit="ratio",
                  source=f"`nvmlGpmMetricsGet(NVML_GPM_METRIC_{constant})`", profile=profile,
                  doc=doc + _PRESENT)


#: GPM key -> the family of its ratio (name and help from gpm.METRICS)
RATIOS: dict[str, Family] = {m.key: _ratio(m) for m in gpm.METRICS}

DECLARED = (SUPPORTED, WINDOW, *RATIOS.values())


def profiling_families(reading: ProfilingReading, snapshot: Any) -> Iterator[Metric]:
    labels = {i.index: [str(i.index), i.uuid] for i in snapshot.identities if i is not None}
    supported, window = SUPPORTED.gauge(), WINDOW.gauge()
    ratios: dict[str, GaugeMetricFamily] = {k: f.gauge() for k, f in RATIOS.items()}
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
