"""What each NVML call costs on a real H200, charged by the fake so that benchmarks on
the fake predict the hardware.

Source: measured on an NVIDIA H200 (driver 580.159, nvidia-ml-py 13.610, 2026-11-30),
idle and under a bf16 matmul load: /work/shared/REFERENCE.md ("NVML power and energy")
and issue 11. Figures are per Python-level pynvml call (wall, CPU), taking the middle of
the idle and loaded figures; `scripts/device_check.py` re-measures them on a GPU. Where a
call costs more CPU than wall time (the energy counter: the driver works on more than
one thread), the fake burns the CPU figure on the calling thread, so its wall time is
a little longer than the hardware's.

A symbol that pynvml calls twice per Python call (nvmlDeviceGetSamples: count, then
fill) is charged almost all on the second. Calls not listed cost DEFAULT, the simple
getters' 1-8 us; fields not listed cost FIELD_DEFAULT.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

US, MS = 1e-6, 1e-3


@dataclass(frozen=True)
class Cost:
    wall: float  # seconds
    cpu: float  # seconds of CPU on the calling thread


def _c(wall: float, cpu: float | None = None) -> Cost:
    return Cost(wall, wall if cpu is None else cpu)


@dataclass(frozen=True)
class CostModel:
    calls: dict[str, Cost] = field(default_factory=dict)  # by C symbol
    fields: dict[int, Cost] = field(default_factory=dict)  # per field id in a batch
    field_call: Cost = _c(2 * US)  # nvmlDeviceGetFieldValues itself, besides its fields
    field_default: Cost = _c(5 * US)
    default: Cost = _c(5 * US)
    # nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES): a base plus a cost per sample
    # returned: 0.3-0.5 ms for a second's ~55 samples, ~1 ms for the whole buffer
    samples_base: Cost = _c(50 * US)
    samples_each: Cost = _c(6 * US)
    gpm_metrics_first: Cost = _c(5 * MS)  # the process's first nvmlGpmMetricsGet

    def of_call(self, symbol: str) -> Cost:
        return self.calls.get(symbol, self.default)

    def of_fields(self, field_ids: list[int]) -> Cost:
        wall = self.field_call.wall + sum(self.fields.get(f, self.field_default).wall
                                          for f in field_ids)
        cpu = self.field_call.cpu + sum(self.fields.get(f, self.field_default).cpu
                                        for f in field_ids)
        return Cost(wall, cpu)

    def of_samples(self, count: int) -> Cost:
        return Cost(self.samples_base.wall + count * self.samples_each.wall,
                    self.samples_base.cpu + count * self.samples_each.cpu)


H200 = CostModel(
    calls={
        "nvmlDeviceGetTotalEnergyConsumption": _c(3.4 * MS, 4.8 * MS),
        "nvmlDeviceGetPowerUsage": _c(4 * US),
        "nvmlDeviceGetMemoryInfo": _c(6 * US),
        "nvmlDeviceGetMemoryInfo_v2": _c(7 * US),
        "nvmlDeviceGetComputeRunningProcesses_v3": _c(15 * US),  # twice per call: 30 us
        "nvmlDeviceGetProcessUtilization": _c(1.0 * MS),  # twice per call: ~2 ms of CPU
        "nvmlDeviceGetProcessesUtilizationInfo": _c(2.0 * MS),
        "nvmlDeviceGetEncoderUtilization": _c(2 * US),
        "nvmlDeviceGetDecoderUtilization": _c(2 * US),
        "nvmlGpmSampleGet": _c(52 * US),
        "nvmlGpmMigSampleGet": _c(52 * US),
        # MIG identity (unverified: no MIG-mode GPU was measured; taken as simple getters)
        "nvmlDeviceGetMigMode": _c(5 * US),
        "nvmlDeviceGetMaxMigDeviceCount": _c(5 * US),
        "nvmlDeviceGetMigDeviceHandleByIndex": _c(5 * US),
        "nvmlDeviceGetGpuInstanceId": _c(5 * US),
        "nvmlDeviceGetComputeInstanceId": _c(5 * US),
        "nvmlDeviceGetAttributes_v2": _c(8 * US),
        "nvmlGpmMetricsGet": _c(1.5 * MS),  # 8 metrics (1.0-1.9 ms); 5 ms the first time
    },
    fields={
        83: _c(3.5 * MS, 4.8 * MS),  # TOTAL_ENERGY_CONSUMPTION
        186: _c(5 * US), 185: _c(4 * US), 82: _c(4 * US),  # power instant/average, HBM temp
        94: _c(125 * US), 197: _c(125 * US), 198: _c(125 * US),  # PCIe replays, TX, RX
        29: _c(8 * US), 30: _c(8 * US), 31: _c(8 * US),  # retired pages (NotSupported)
        74: _c(3 * US), 269: _c(3 * US),  # violation time: SW power cap, SW thermal
        75: _c(0.55 * MS), 270: _c(0.55 * MS), 271: _c(0.55 * MS),  # thermal, HW brake
    },
)

_BLOCK = bytes(2048)  # hashed to burn CPU: hashlib releases the GIL from 2048 bytes on


def charge(cost: Cost, spent_cpu: float = 0.0, started: float | None = None) -> None:
    """Take `cost` from the calling thread: burn CPU up to cost.cpu (less what the call
    already spent), without holding the GIL, as a C call would; then wait out the rest of
    cost.wall (from `started`, a perf_counter reading)."""
    started = time.perf_counter() if started is None else started
    burn = cost.cpu - spent_cpu
    if burn > 0:
        end = time.thread_time() + burn
        while time.thread_time() < end:
            hashlib.sha256(_BLOCK)
    rest = cost.wall - (time.perf_counter() - started)
    if rest > 50 * US:  # below that, sleeping overshoots more than it adds
        time.sleep(rest)
