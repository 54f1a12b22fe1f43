"""GPM (profiling metrics) on GPU 0: support, what nvmlGpmSampleGet and nvmlGpmMetricsGet
cost (the first MetricsGet apart: 5 ms on an H200), and the 8 metrics the exporter
exports over a few seconds of whatever load the GPU runs; and where a GPU is already in MIG
mode (the check never changes it), what nvmlGpmMigSampleGet and the 5 per-instance metrics
cost on its first GPU instance, the figures docs/nvml-costs.md gives as estimates until
measured."""

from __future__ import annotations

import time
from collections.abc import Callable

from exporter.collectors.mig.reading import read_mig_devices
from exporter.gpu import gpm
from exporter.gpu.backend import NvmlBackend


def _request(nvml, first, second, metrics=gpm.METRICS):
    request = nvml.c_nvmlGpmMetricsGet_t()
    request.version = nvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(metrics)
    request.sample1, request.sample2 = first, second
    for i, metric in enumerate(metrics):
        request.metrics[i].metricId = metric.id
    return request


def mig_costs(backend: NvmlBackend, timed: Callable[..., dict]) -> dict:
    """nvmlGpmMigSampleGet and its MetricsGet on the first GPU instance of the first GPU
    in MIG mode; says so where none is (MIG mode is never changed here)."""
    for index in range(len(backend.handles)):
        mode, devices = read_mig_devices(backend, index)
        if mode and devices:
            break
    else:
        return {"status": "no GPU in MIG mode: the per-instance costs stay estimates"}
    nvml, handle, gi = backend.nvml, backend.handle(index), devices[0].gpu_instance
    first, second = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    try:
        out = {"gpu": index, "gpu_instance": gi, "nvmlGpmMigSampleGet": timed(
            nvml.nvmlGpmMigSampleGet, handle, gi, first, repeat=50)}
        time.sleep(0.2)
        nvml.nvmlGpmMigSampleGet(handle, gi, second)
        out["nvmlGpmMetricsGet(5 metrics, MIG)"] = timed(
            lambda: nvml.nvmlGpmMetricsGet(_request(nvml, first, second, gpm.MIG_METRICS)),
            repeat=50)
    except nvml.NVMLError as exc:  # NoPermission without the MIG capability
        out = {"status": f"timing the MIG GPM calls failed: {type(exc).__name__}"}
    finally:
        nvml.nvmlGpmSampleFree(first)
        nvml.nvmlGpmSampleFree(second)
    return out


def _costs(backend: NvmlBackend, timed: Callable[..., dict]) -> dict:
    nvml, handle = backend.nvml, backend.handle(0)
    first, second = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    try:
        out = {"nvmlGpmSampleGet": timed(nvml.nvmlGpmSampleGet, handle, first, repeat=50)}
        time.sleep(0.2)  # GPM wants its two samples > 100 ms apart
        nvml.nvmlGpmSampleGet(handle, second)
        out["nvmlGpmMetricsGet(8 metrics), first call"] = timed(
            lambda: nvml.nvmlGpmMetricsGet(_request(nvml, first, second)), repeat=1)
        out["nvmlGpmMetricsGet(8 metrics)"] = timed(
            lambda: nvml.nvmlGpmMetricsGet(_request(nvml, first, second)), repeat=50)
    finally:
        nvml.nvmlGpmSampleFree(first)
        nvml.nvmlGpmSampleFree(second)
    return out


def gpm_check(backend: NvmlBackend, seconds: float, timed: Callable[..., dict]) -> dict:
    """The report's `gpm` section for GPU 0."""
    reader = gpm.GpmReader(backend, 0)
    status = reader.support()
    report: dict = {"status": status}
    if status != gpm.SUPPORTED:
        return report
    report["mig"] = mig_costs(backend, timed)
    try:
        report["call_latency"] = _costs(backend, timed)
    except backend.nvml.NVMLError as exc:  # e.g. NoPermission in MIG mode
        report["error"] = f"timing the GPM calls failed: {type(exc).__name__}"
        return report
    reader.read(time.time())
    time.sleep(seconds)
    reading = reader.read(time.time())
    reader.close()
    if reading is None or not reading.values:
        report["error"] = f"no GPM metrics (status {reader.status}); see nvml_errors"
        return report
    report["window_seconds"] = round(reading.end - reading.start, 3)
    report["metrics"] = {key: round(value, 4) for key, value in reading.values.items()}
    report["compute_share"] = gpm.compute_share(reading.values)
    return report
