"""The fake's GPM symbols (profiling metrics, Hopper and later): support, sample buffers,
samples and the metrics between two samples.

A sample records which GPU and when; nvmlGpmMetricsGet answers each metric as the average,
over the time between the two samples, of its level in each phase the GPU went through
(physics.FakeGpu.phase_seconds: compute, communication, waiting in a collective, writing a
checkpoint, idle), so the figures follow the workload: compute shows tensor and SM
activity, a collective keeps the SMs busy without tensor activity, idle is all zeros, and
a straggler computes while its peers wait. A replayed trace that carries the metrics
answers them from the trace. `gpm: false` in a scenario's device (before Hopper) makes
nvmlGpmQueryDeviceSupport say no and every other call NotSupported.

On a GPU in MIG mode, as for an unprivileged process on the hardware, the whole-GPU
`nvmlGpmSampleGet` answers NoPermission, and `nvmlGpmMigSampleGet(parent, gpu_instance)`
samples one GPU instance: its metrics are the compute levels scaled by the SM utilization
of the scenario's processes on that instance over the interval (their `sm_util` times the
share of the interval each ran), so an instance without a process reads zeros and the
notebook of the `mig` scenario shows as it comes and goes.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import pynvml

from exporter.gpu import gpm
from exporter.sim.cstructs import target, value_of, write_pointer
from exporter.sim.fake_core import FakeCore
from exporter.sim.physics import FakeGpu

SUCCESS, ERROR_UNINITIALIZED, ERROR_INVALID_ARGUMENT, ERROR_NOT_SUPPORTED = 0, 1, 2, 3
ERROR_NO_PERMISSION, ERROR_NOT_FOUND = 4, 6
ERROR_ARGUMENT_VERSION_MISMATCH = 25
SAMPLE_BASE = 0x7E59_0000  # fake sample buffers are this plus a serial number

# Each metric's level (percent) in each phase of a GPU's time, by NVML_GPM_METRIC_* id.
# Compute: a bf16 transformer step (an H200 under a bf16 matmul load measured graphics 57 %,
# SM 48 %, occupancy 7 %, tensor 47 %, DRAM 12 % at a 0.6 duty cycle: docs/nvml-costs.md).
# A collective runs NCCL kernels on a few SMs: the engine is busy, the tensor pipes idle.
_LEVELS: dict[str, dict[int, float]] = {
    "compute": {1: 97.0, 2: 86.0, 3: 24.0, 4: 9.0, 5: 74.0, 7: 74.0, 10: 38.0, 11: 0.0,
                12: 11.0, 13: 6.0},
    "communication": {1: 96.0, 2: 23.0, 3: 3.0, 4: 2.0, 10: 14.0, 12: 2.0, 13: 1.0},
    "waiting": {1: 96.0, 2: 17.0, 3: 2.0, 4: 1.0},  # spinning on a flag: no math, no DRAM
    "writing": {1: 3.0, 2: 1.0, 10: 6.0},  # copy engines move the checkpoint out
    "idle": {},
}
_METRIC_IDS = {m.id for m in gpm.METRICS} | {4, 6, 7, 8, 9}
_KEY_OF = {m.id: m.key for m in gpm.METRICS}
# GPM's PCIe rates (MiB/s): the model's PCIe byte counters over the interval
_PCIE_COUNTER = {20: "pcie_transmit_bytes", 21: "pcie_receive_bytes"}


@dataclass
class _Sample:
    gpu: int | None = None  # None until nvmlGpmSampleGet fills it
    time: float = 0.0
    gpu_instance: int | None = None  # set by nvmlGpmMigSampleGet


class GpmSymbols(FakeCore):
    """Mixin of FakeNvmlLibrary."""

    def init_gpm(self) -> None:
        self._gpm_lock = threading.Lock()
        self._gpm_samples: dict[int, _Sample] = {}
        self._gpm_allocated = 0
        self._gpm_metrics_calls = 0

    def gpm_supported(self, gpu: FakeGpu) -> bool:
        return self.scenario.device.gpm and any(gpu.provides(k) for k in gpm.KEYS)

    def _nvmlGpmQueryDeviceSupport(self, handle, support) -> int:
        gpu = self.gpu(handle)
        if gpu is None:
            return ERROR_UNINITIALIZED if self.initialized <= 0 else ERROR_INVALID_ARGUMENT
        out = target(support)
        if out.version != pynvml.NVML_GPM_SUPPORT_VERSION:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        out.isSupportedDevice = int(self.gpm_supported(gpu))
        return SUCCESS

    def _nvmlGpmSampleAlloc(self, sample) -> int:
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        with self._gpm_lock:
            self._gpm_allocated += 1
            number = self._gpm_allocated
            self._gpm_samples[number] = _Sample()
        write_pointer(sample, SAMPLE_BASE + number)
        return SUCCESS

    def _gpm_sample(self, pointer) -> _Sample | None:
        address = ctypes.cast(pointer, ctypes.c_void_p).value or 0
        return self._gpm_samples.get(address - SAMPLE_BASE)

    def _nvmlGpmSampleFree(self, sample) -> int:
        address = ctypes.cast(sample, ctypes.c_void_p).value or 0
        with self._gpm_lock:
            found = self._gpm_samples.pop(address - SAMPLE_BASE, None)
        return SUCCESS if found is not None else ERROR_INVALID_ARGUMENT

    def _nvmlGpmSampleGet(self, handle, sample) -> int:
        gpu = self.gpu(handle)
        if gpu is None:
            return ERROR_UNINITIALIZED if self.initialized <= 0 else ERROR_INVALID_ARGUMENT
        if not self.gpm_supported(gpu):
            return ERROR_NOT_SUPPORTED
        if self.mig_instances(gpu.index):
            return ERROR_NO_PERMISSION  # device-level GPM in MIG mode needs root
        record = self._gpm_sample(sample)
        if record is None:
            return ERROR_INVALID_ARGUMENT
        record.gpu, record.time, record.gpu_instance = gpu.index, self.now(), None
        return SUCCESS

    def _nvmlGpmMigSampleGet(self, handle, gpu_instance, sample) -> int:
        gpu = self.gpu(handle)
        if gpu is None:
            return ERROR_UNINITIALIZED if self.initialized <= 0 else ERROR_INVALID_ARGUMENT
        if not self.gpm_supported(gpu) or not self.mig_instances(gpu.index):
            return ERROR_NOT_SUPPORTED
        gi = value_of(gpu_instance)
        if gi not in {i.gpu_instance for i in self.mig_instances(gpu.index)}:
            return ERROR_NOT_FOUND
        record = self._gpm_sample(sample)
        if record is None:
            return ERROR_INVALID_ARGUMENT
        record.gpu, record.time, record.gpu_instance = gpu.index, self.now(), gi
        return SUCCESS

    def _nvmlGpmMetricsGet(self, metrics_get) -> int:
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        request = target(metrics_get)
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        first, second = self._gpm_sample(request.sample1), self._gpm_sample(request.sample2)
        if (first is None or second is None or first.gpu is None or first.gpu != second.gpu
                or first.gpu_instance != second.gpu_instance
                or second.time <= first.time or request.numMetrics > len(request.metrics)):
            return ERROR_INVALID_ARGUMENT
        gpu = self.gpus[first.gpu]
        if first.gpu_instance is not None:
            shares = {"compute": self._instance_activity(gpu.index, first.gpu_instance,
                                                         first.time, second.time)}
        else:
            shares = {phase: seconds / (second.time - first.time)
                      for phase, seconds in gpu.phase_seconds(first.time,
                                                              second.time).items()}
        for i in range(request.numMetrics):
            entry = request.metrics[i]
            if entry.metricId in _PCIE_COUNTER and first.gpu_instance is None:
                value = self._gpm_pcie(gpu, _PCIE_COUNTER[entry.metricId], first.time,
                                       second.time)
            else:
                value = self._gpm_percent(gpu, entry.metricId, shares, second.time)
            entry.nvmlReturn = SUCCESS if value is not None else ERROR_NOT_SUPPORTED
            entry.value = value if value is not None else 0.0
        self._gpm_metrics_calls += 1
        if self.costs is not None and self._gpm_metrics_calls == 1:
            self.pending_cost = self.costs.gpm_metrics_first
        return SUCCESS

    def _instance_activity(self, gpu: int, gpu_instance: int, t0: float, t1: float) -> float:
        """The GPU instance's SM utilization over (t0, t1] (epoch seconds), 0-1."""
        a, b = t0 - self.start, t1 - self.start
        busy = sum(p.sm_util * p.overlap(a, b) for p in self.running(gpu, t0, t1)
                   if p.gpu_instance == gpu_instance)
        return min(1.0, busy / (b - a))

    def _gpm_pcie(self, gpu: FakeGpu, counter: str, t0: float, t1: float) -> float | None:
        """The PCIe traffic over (t0, t1] in MiB/s, from the model's byte counter."""
        first, second = self.model(gpu, counter, t0), self.model(gpu, counter, t1)
        if first is None or second is None:
            return None
        return max(0.0, second - first) / (t1 - t0) / gpm.MIB

    def _gpm_percent(self, gpu: FakeGpu, metric: int, shares: dict[str, float],
                     t: float) -> float | None:
        """A metric over the interval (percent); None: NotSupported."""
        if metric not in _METRIC_IDS:
            return None
        key = _KEY_OF.get(metric, f"gpm_metric_{metric}")
        if not gpu.provides(key):  # a replayed trace without it
            return None
        recorded = gpu.recorded(key, t)  # a replayed trace's value
        if recorded is not None:
            return 100.0 * recorded
        return sum(share * _LEVELS[phase].get(metric, 0.0) for phase, share in shares.items())
