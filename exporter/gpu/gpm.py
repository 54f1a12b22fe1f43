"""NVML GPM (GPU Performance Monitoring, Hopper and later): the profiling counters that
dcgm-exporter exports as `DCGM_FI_PROF_*`, read through pynvml without DCGM.

GPM works on pairs of samples: `nvmlGpmSampleGet` fills a sample buffer (52 us on an
H200), and `nvmlGpmMetricsGet` turns two of them into metrics averaged over the time
between them (1.0-1.9 ms for 8 metrics, 5 ms the first time; a whole GPU's call also asks
the two PCIe rates, 10 metrics). `GpmReader` keeps two
buffers per GPU and alternates them, so each reading takes one new sample and covers the
whole time since the previous one: no gaps, one SampleGet and one MetricsGet per GPU and
reading.

Support is asked once per GPU (`nvmlGpmQueryDeviceSupport`); where GPM is unsupported the
reader says why (`status`), and nothing else is asked.

On a GPU in MIG mode, `GpmMigReader` samples one GPU instance
(`nvmlGpmMigSampleGet(parent, gpu_instance, sample)`) and asks the :data:`MIG_METRICS`;
its ratios are shares of that instance's own SMs and memory bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # reading needs the backend; the dataclasses (rendered) must not need NVML
    from exporter.gpu.backend import NvmlBackend


@dataclass(frozen=True)
class GpmMetric:
    id: int  # NVML_GPM_METRIC_* (nvml.h)
    key: str  # base-unit name: the trace column
    metric: str  # the Prometheus family
    dcgm: str  # the DCGM field with the same meaning (dcgm-exporter's name for it)
    help: str


_M = GpmMetric
METRICS: tuple[GpmMetric, ...] = (
    _M(1, "graphics_engine_active_ratio", "gpu_graphics_engine_active_ratio",
       "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Share of time the graphics/compute engine had "
       "work (any kernel resident, busy-waiting included), from GPM (0-1)."),
    _M(2, "sm_active_ratio", "gpu_sm_active_ratio", "DCGM_FI_PROF_SM_ACTIVE",
       "Share of time an SM had at least one warp resident, averaged over all SMs, from "
       "GPM (0-1)."),
    _M(3, "sm_occupancy_ratio", "gpu_sm_occupancy_ratio", "DCGM_FI_PROF_SM_OCCUPANCY",
       "Resident warps as a share of the SMs' maximum, averaged over time and SMs, from "
       "GPM (0-1)."),
    _M(5, "tensor_active_ratio", "gpu_tensor_active_ratio", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
       "Share of time the tensor pipes were busy (any precision), averaged over SMs, from "
       "GPM (0-1)."),
    _M(10, "dram_active_ratio", "gpu_dram_active_ratio", "DCGM_FI_PROF_DRAM_ACTIVE",
       "Device-memory bandwidth in use as a share of the maximum, from GPM (0-1)."),
    _M(11, "fp64_active_ratio", "gpu_fp64_active_ratio", "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
       "Share of time the FP64 (non-tensor) pipes were busy, averaged over SMs, from GPM "
       "(0-1)."),
    _M(12, "fp32_active_ratio", "gpu_fp32_active_ratio", "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
       "Share of time the FP32 (non-tensor) pipes were busy, averaged over SMs, from GPM "
       "(0-1)."),
    _M(13, "fp16_active_ratio", "gpu_fp16_active_ratio", "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
       "Share of time the FP16 (non-tensor) pipes were busy, averaged over SMs, from GPM "
       "(0-1)."),
)
KEYS = tuple(m.key for m in METRICS)
#: GPM's PCIe traffic (nvml.h: MiB/s), asked of whole GPUs in the same nvmlGpmMetricsGet
#: as the ratios: dcgm-exporter's DCGM_FI_PROF_PCIE_TX_BYTES and _RX_BYTES (bytes per
#: second). Not a family of ours: gpu_pcie_*_bytes_total count the same traffic.
PCIE_RATES: tuple[tuple[int, str], ...] = ((20, "pcie_transmit_bytes_per_second"),
                                           (21, "pcie_receive_bytes_per_second"))
MIB = 2.0 ** 20
#: What is read per MIG GPU instance (the activity the energy split and dashboards use).
MIG_KEYS = ("graphics_engine_active_ratio", "sm_active_ratio", "sm_occupancy_ratio",
            "tensor_active_ratio", "dram_active_ratio")
MIG_METRICS: tuple[GpmMetric, ...] = tuple(m for m in METRICS if m.key in MIG_KEYS)
# The math pipes: a GPU "computes" while one of them is busy. A GPU spinning in a NCCL
# collective keeps its SMs (and the graphics engine) active but its math pipes nearly idle.
COMPUTE_KEYS = ("tensor_active_ratio", "fp64_active_ratio", "fp32_active_ratio",
                "fp16_active_ratio")

# Why a GPU has (or has no) GPM metrics: the `reason` label of gpu_profiling_supported.
SUPPORTED = "supported"
UNSUPPORTED_DEVICE = "unsupported_device"  # before Hopper: nvmlGpmQueryDeviceSupport says no
UNSUPPORTED_DRIVER = "unsupported_driver"  # the driver (or bindings) has no GPM symbols
NO_PERMISSION = "no_permission"  # e.g. MIG mode, where device-level GPM needs root
ERROR = "error"  # another error: asked again at the next reading
REASONS = (SUPPORTED, UNSUPPORTED_DEVICE, UNSUPPORTED_DRIVER, NO_PERMISSION, ERROR)
_BY_ERROR = {"NotSupported": UNSUPPORTED_DEVICE, "FunctionNotFound": UNSUPPORTED_DRIVER,
             "NoPermission": NO_PERMISSION}


def compute_share(values: Mapping[str, float]) -> float | None:
    """The busiest math pipe's share of the time (any precision); None without one."""
    shares = [values[k] for k in COMPUTE_KEYS if k in values]
    return max(shares) if shares else None


@dataclass(frozen=True)
class GpmReading:
    start: float  # epoch seconds of the earlier sample
    end: float  # of the later one: the values are averages over (start, end]
    values: Mapping[str, float]  # key -> 0-1; a metric NVML did not give is absent
    # PCIE_RATES key -> bytes per second over the same interval (whole GPUs only)
    rates: Mapping[str, float] = field(default_factory=dict)


class GpmReader:
    """GPM on one GPU: support asked once, two sample buffers used in turn."""

    metrics = METRICS
    rates = PCIE_RATES

    def __init__(self, backend: NvmlBackend, gpu: int):
        self.backend, self.gpu = backend, gpu
        self.status: str | None = None  # a REASONS entry; None until asked
        self._buffers: list[Any] = []
        self._next = 0  # the buffer the next sample goes into
        self._previous: tuple[Any, float] | None = None  # (buffer, time) of the last sample

    def support(self) -> str:
        if self.status in (None, ERROR):
            self.status = self._query()
        return self.status

    def _query(self) -> str:
        handle = self.backend.handle(self.gpu)
        if handle is None:
            return ERROR
        answer, error = self.backend.attempt("nvmlGpmQueryDeviceSupport", handle, gpu=self.gpu)
        if error is not None:
            return _BY_ERROR.get(error, ERROR)
        return SUPPORTED if answer.isSupportedDevice else UNSUPPORTED_DEVICE

    def read(self, now: float) -> GpmReading | None:
        """Take a sample; the metrics since the previous one (None on the first sample,
        where GPM is unsupported, or when a call failed: the backend counted it)."""
        if self.support() != SUPPORTED or not self._allocate():
            return None
        handle = self.backend.handle(self.gpu)
        if handle is None:
            self._previous = None
            return None
        buffer = self._buffers[self._next]
        _, error = self._sample(handle, buffer)
        if error is not None:
            self._previous = None  # the next sample starts a new interval
            if error in _BY_ERROR:
                self.status = _BY_ERROR[error]
            return None
        previous, self._previous = self._previous, (buffer, now)
        self._next ^= 1
        if previous is None:
            return None
        values, rates = self._metrics(previous[0], buffer)
        return GpmReading(previous[1], now, values, rates)

    def _sample(self, handle: Any, buffer: Any) -> tuple[Any, str | None]:
        return self.backend.attempt("nvmlGpmSampleGet", handle, buffer, gpu=self.gpu)

    def restart(self) -> None:
        """Forget the last sample: the next read starts a new interval (after a GPU was
        unreadable, its interval would span the gap)."""
        self._previous = None

    def _allocate(self) -> bool:
        while len(self._buffers) < 2:
            buffer, error = self.backend.attempt("nvmlGpmSampleAlloc", gpu=self.gpu)
            if error is not None:
                if error in _BY_ERROR:
                    self.status = _BY_ERROR[error]
                return False
            self._buffers.append(buffer)
        return True

    def _metrics(self, first: Any, second: Any) -> tuple[dict[str, float], dict[str, float]]:
        """The ratios (0-1) and the PCIe rates (bytes per second) between two samples."""
        nvml = self.backend.nvml  # its own struct types: the fleet runs private pynvml copies
        asked = [(m.id, m.key) for m in self.metrics] + list(self.rates)
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(asked)
        request.sample1, request.sample2 = first, second
        for i, (metric_id, _) in enumerate(asked):
            request.metrics[i].metricId = metric_id
        answer = self.backend.call("nvmlGpmMetricsGet", request, gpu=self.gpu)
        if answer is None:
            return {}, {}
        values: dict[str, float] = {}
        rates: dict[str, float] = {}
        for i, (metric_id, key) in enumerate(asked):
            entry = answer.metrics[i]
            if entry.nvmlReturn != 0:
                error = _error_name(nvml, entry.nvmlReturn)
                self.backend.errors.add(f"nvmlGpmMetricsGet({key})", error)
                if i >= len(self.metrics) and error == "NotSupported":
                    # a driver without it: counted once, not every interval (the sweep's
                    # PCIe counters stand in)
                    self.rates = tuple(r for r in self.rates if r[0] != metric_id)
                continue
            if not math.isfinite(entry.value):
                continue
            if i >= len(self.metrics):  # MiB/s; never negative
                rates[key] = max(0.0, entry.value) * MIB
            else:  # GPM gives percent; rounding may pass 100
                values[key] = min(1.0, max(0.0, entry.value / 100.0))
        return values, rates

    def close(self) -> None:
        """Free the sample buffers (only once no read can be using them)."""
        for buffer in self._buffers:
            self.backend.call("nvmlGpmSampleFree", buffer)
        self._buffers, self._previous = [], None


class GpmMigReader(GpmReader):
    """GPM on one MIG GPU instance of a GPU: `nvmlGpmMigSampleGet` on the parent's handle.
    Support is the parent's answer; the errors of its calls are not keyed by GPU (one
    instance's NotFound, when it was destroyed, must not stop the parent's other reads)."""

    metrics = MIG_METRICS
    rates = ()  # PCIe traffic is the whole GPU's

    def __init__(self, backend: NvmlBackend, gpu: int, gpu_instance: int):
        super().__init__(backend, gpu)
        self.gpu_instance = gpu_instance

    def _sample(self, handle: Any, buffer: Any) -> tuple[Any, str | None]:
        return self.backend.attempt("nvmlGpmMigSampleGet", handle, self.gpu_instance, buffer)


def _error_name(nvml: Any, code: int) -> str:
    from exporter.gpu.backend import error_name

    return error_name(nvml.NVMLError(code))
