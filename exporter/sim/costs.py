"""What each NVML call costs on a real H200, charged by the fake so that benchmarks on
the fake predict the hardware.

Source: measured on an NVIDIA H200 (driver 580.159, nvidia-ml-py 13.610, 2026-11-30),
idle and under a bf16 matmul load; docs/nvml-costs.md lists them and says how they
were measured. Figures are per Python-level pynvml call (wall, CPU), taking the middle of
the idle and loaded figures; `scripts/device_check.py` re-measures them on a GPU. Where a
call costs more CPU than wall time (the energy counter: the driver works on more than
one thread), the fake burns the CPU figure on the calling thread, so its wall time is
a little longer than the hardware's.

A symbol that pynvml calls twice per Python call (nvmlDeviceGetSamples: count, then
fill) is charged almost all on the second. Calls not listed cost DEFAULT, the simple
getters' 1-8 us; fields not listed cost FIELD_DEFAULT.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
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
        # an estimate: nvmlGpmSampleGet's figure (no GPU in MIG mode was measured yet)
        "nvmlGpmMigSampleGet": _c(52 * US),
        # MIG identity (unverified: no MIG-mode GPU was measured; taken as simple getters)
        "nvmlDeviceGetMigMode": _c(5 * US),
        "nvmlDeviceGetMaxMigDeviceCount": _c(5 * US),
        "nvmlDeviceGetMigDeviceHandleByIndex": _c(5 * US),
        "nvmlDeviceGetGpuInstanceId": _c(5 * US),
        "nvmlDeviceGetComputeInstanceId": _c(5 * US),
        "nvmlDeviceGetAttributes_v2": _c(8 * US),
        "nvmlDeviceGetGpuInstanceById": _c(5 * US),  # estimates, as simple getters
        "nvmlGpuInstanceGetInfo": _c(5 * US),
        "nvmlGpmMetricsGet": _c(1.5 * MS),  # 8 metrics (1.0-1.9 ms); 5 ms the first time
        # Estimates, not measured (the H200 measured has no NVSwitch fabric and no InfoROM
        # check was timed): the fabric state is the driver's cached copy of what the
        # fabric manager sent, a getter like the PCI info (~8 us); validating the InfoROM
        # checksums its objects in the driver, taken as the slower counter fields (~0.5
        # ms). Both are read once a minute per GPU (--sweep.board-interval).
        "nvmlDeviceGetGpuFabricInfoV": _c(8 * US),
        "nvmlDeviceValidateInforom": _c(0.5 * MS),
        # Estimate, not measured on an H200 (the one measured has no NVLink peers): one
        # link's data CRC counter (links 12+), the field the CRC data fields read for
        # links 0-11 (below), taken at their estimate.
        "nvmlDeviceGetNvLinkErrorCounter": _c(5 * US),
    },
    fields={
        83: _c(3.5 * MS, 4.8 * MS),  # TOTAL_ENERGY_CONSUMPTION
        186: _c(5 * US), 185: _c(4 * US), 82: _c(4 * US),  # power instant/average, HBM temp
        94: _c(125 * US), 197: _c(125 * US), 198: _c(125 * US),  # PCIe replays, TX, RX
        29: _c(8 * US), 30: _c(8 * US), 31: _c(8 * US),  # retired pages (NotSupported)
        74: _c(3 * US), 269: _c(3 * US),  # violation time: SW power cap, SW thermal
        75: _c(0.55 * MS), 270: _c(0.55 * MS), 271: _c(0.55 * MS),  # thermal, HW brake
        # Estimates, not measured on an H200 (scripts/device_check.py times each on a GPU):
        # ECC totals and row remapping (3-6, 142-145) are memory-error counters the driver
        # keeps, like the retired pages (29-31, measured 8 us; NotSupported there, so a
        # supported answer may cost more); the power limit's maximum (188) and the
        # recovery action (230) are driver state, taken as the simple getters (1-8 us).
        3: _c(8 * US), 4: _c(8 * US), 5: _c(8 * US), 6: _c(8 * US),
        142: _c(8 * US), 143: _c(8 * US), 144: _c(8 * US), 145: _c(8 * US),
        188: _c(5 * US), 230: _c(5 * US),
        # Estimates, not measured on an H200 (the one measured has no NVLink peers: field
        # 91 NotSupported): the per-link NVLink fields, charged as the cheap fields
        # (5 us each per link). Link state (165) is driver state. The traffic and error
        # counters (138, 139, 161-163, data CRC 39-44/102-107) may be read from the
        # hardware per request as the PCIe counters are (94/197/198: 80-170 us): at that
        # cost 18 links would make a device read ~13 ms a GPU, not ~0.5; to be measured on
        # an NVLink node.
        **{fid: _c(5 * US) for fid in (165, 138, 139, 161, 162, 163,
                                       39, 40, 41, 42, 43, 44, 102, 103, 104, 105, 106, 107)},
    },
)

# CPU is burned by hashing zeros: hashlib releases the GIL while it hashes 2048 bytes or
# more, so other threads run meanwhile, as they do beside a C call into the driver. Each
# chunk is sized to what is left of the burn (at the rate the last chunks ran), so a burn
# is a handful of GIL-free calls: hashing 2 KiB at a time took the GIL back some 250 times
# in a 0.4 ms burn, and those hand-overs cost the other threads CPU a real call does not.
_CHUNK_MAX = 1 << 20  # at most ~1 ms of hashing per chunk


@functools.cache
def _zeros() -> memoryview:
    """The zeros hashed, made on the first burn: with the costs off (--no-fake.costs)
    the fake never holds this MiB."""
    return memoryview(bytes(_CHUNK_MAX))


@functools.cache
def _sha256() -> Callable[[memoryview], object]:
    """OpenSSL's SHA-256 (hashlib's, which lets go of the GIL), loaded on the first burn:
    with the costs off the fake never loads libcrypto (~3.5 MiB)."""
    import hashlib

    return hashlib.sha256


_MIN_CHUNK = 2048
_rate = [1e9]  # bytes hashed per CPU-second, as last measured
# Each thread keeps a credit: the fake's own Python beyond a call's modelled CPU (a
# simple getter is 10-20 us of Python, 2-8 us on an H200) and a burn's overshoot. Burns
# of CREDIT_MIN or more are cut by it, so a thread's CPU inside the fake adds up to what
# the H200 charges for its calls; cheap calls are never cut, and every call still takes
# at least its modelled wall time. Credit beyond CREDIT_MAX is dropped. The cap must
# hold what a thread accrues between its large calls: the sweep's ~80 cheap calls a
# second leave 1-2 ms of credit a second, and its energy read (8 GPUs, ~50 ms, every
# 30 s) is where most of it is given back; at 20 ms the sweep's CPU inside the fake was
# 0.48 % of a core against 0.385 % modelled, at 250 ms 0.37 %.
CREDIT_MIN, CREDIT_MAX = 100 * US, 250 * MS
_ledger = threading.local()


def burn(seconds: float) -> None:
    """Spend about `seconds` of this thread's CPU outside the GIL."""
    now = time.thread_time()
    end = now + seconds
    while now < end:
        size = min(_CHUNK_MAX, max(_MIN_CHUNK, int((end - now) * _rate[0])))
        _sha256()(_zeros()[:size])
        then, now = now, time.thread_time()
        if now > then:
            _rate[0] = 0.5 * _rate[0] + 0.5 * size / (now - then)


def charge(cost: Cost, cpu_start: float | None = None, started: float | None = None) -> float:
    """Take `cost` from the calling thread: burn CPU up to cost.cpu, counted from
    `cpu_start` (a thread_time reading at the call's start) and less this thread's
    credit, without holding the GIL, as a C call would; then wait out the rest of
    cost.wall (from `started`, a perf_counter reading). Returns the CPU the call took."""
    started = time.perf_counter() if started is None else started
    cpu_start = time.thread_time() if cpu_start is None else cpu_start
    credit = getattr(_ledger, "credit", 0.0)
    spent = time.thread_time() - cpu_start
    owed = cost.cpu - spent - (credit if cost.cpu >= CREDIT_MIN else 0.0)
    if owed > 0:
        burn(owed)
    rest = cost.wall - (time.perf_counter() - started)
    if rest > 50 * US:  # below that, sleeping overshoots more than it adds
        time.sleep(rest)
    if owed > 0 or rest > 50 * US:  # else the reading above is still the call's CPU
        spent = time.thread_time() - cpu_start
    _ledger.credit = min(max(0.0, credit + spent - cost.cpu), CREDIT_MAX)
    return spent
