"""A fake NVML driver library that stands in *under* pynvml.

pynvml (nvidia-ml-py) loads libnvidia-ml.so.1 into its module global `nvmlLib`
only while that is None, then looks every C symbol up by name with getattr and
caches it. Installing a FakeNvmlLibrary there makes every pynvml wrapper,
ctypes struct and NVMLError subclass run for real: the exporter's backend takes
exactly the production code path, and only the silicon is simulated.

Each symbol takes the ctypes arguments pynvml passes (byref targets, string
buffers, field-value arrays), fills them and returns an NVML return code.
Values come from a Scenario evaluated at the time of the call.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from types import ModuleType

import numpy as np
import pynvml

from exporter.sim.scenarios import (
    CLOCK_EVENT_BITS,
    ERROR_CODES,
    RECOVERY_ACTIONS,
    FaultEvent,
    Scenario,
)

SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3

_HANDLE_BASE = 0x7E57_0000
_EVENT_SET_BASE = 0x7E58_0000
_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_NOISE_TABLE = 4096

# Field ids the fake serves (see REFERENCE.md); anything else is NOT_SUPPORTED.
FI_MEMORY_TEMP = pynvml.NVML_FI_DEV_MEMORY_TEMP
FI_TOTAL_ENERGY = pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
FI_PCIE_REPLAY = pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER
FI_POWER_AVERAGE = pynvml.NVML_FI_DEV_POWER_AVERAGE
FI_POWER_INSTANT = pynvml.NVML_FI_DEV_POWER_INSTANT
FI_POWER_LIMIT = pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT
FI_PCIE_TX = pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES
FI_PCIE_RX = pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES

FI_ECC_CURRENT = pynvml.NVML_FI_DEV_ECC_CURRENT
FI_ECC_SBE_VOL, FI_ECC_DBE_VOL = (pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
                                  pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL)
FI_ECC_SBE_AGG, FI_ECC_DBE_AGG = (pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
                                  pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL)
FI_RETIRED_SBE, FI_RETIRED_DBE, FI_RETIRED_PENDING = 29, 30, 31
FI_REMAPPED_COR, FI_REMAPPED_UNC, FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE = 142, 143, 144, 145
FI_RECOVERY_ACTION = 230
FI_NVLINK_COUNT = pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT
FI_NVLINK_STATE = 165
FI_NVLINK_REPLAY, FI_NVLINK_RECOVERY, FI_NVLINK_CRC = 161, 162, 163
FI_NVLINK_TX, FI_NVLINK_RX = 138, 139
# NVLink data-CRC counters exist as one field per link, for links 0-11 only.
FI_NVLINK_CRC_DATA = {**{39 + i: i for i in range(6)}, **{102 + i: 6 + i for i in range(6)}}
NVLINK_BYTES_PER_SECOND = 12e9  # per link while training

_UINT, _ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG


class FakeHookError(RuntimeError):
    """pynvml no longer exposes the globals the fake hooks into."""


def _target(arg):
    """The ctypes object behind a byref() argument (or the object itself)."""
    return getattr(arg, "_obj", arg)


class _Waveform:
    """One training step's power shape, repeated; with its exact running integral."""

    def __init__(self, period: float, fraction: float, ramp: float, high: float, low: float):
        self.period = period
        ramp = min(ramp, period * fraction / 2, period * (1 - fraction) / 2)
        grid = np.linspace(0.0, period, 2049)
        xp = [0.0, ramp, period * fraction, period * fraction + ramp, period]
        self.grid = grid
        self.breaks = xp
        self.levels = [low, high, high, low, low]
        self.low = low
        self.power = np.interp(grid, xp, self.levels)
        steps = (self.power[1:] + self.power[:-1]) / 2 * np.diff(grid)
        self.cumulative = np.concatenate([[0.0], np.cumsum(steps)])
        self.energy_per_period = float(self.cumulative[-1])

    def value(self, x: float) -> float:
        x %= self.period
        xs, ys = self.breaks, self.levels
        for i in range(1, len(xs)):  # piecewise linear; plain Python beats np.interp on scalars
            if x <= xs[i]:
                span = xs[i] - xs[i - 1]
                if span <= 0:
                    return ys[i]
                return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / span
        return self.low

    def integral(self, x: float) -> float:
        """Integral of power from 0 to x (x >= 0), in joules."""
        whole, frac = divmod(x, self.period)
        return whole * self.energy_per_period + float(np.interp(frac, self.grid, self.cumulative))


class _FakeGpu:
    """The simulated physics of one GPU."""

    def __init__(self, index: int, scenario: Scenario, start: float, period: float,
                 fraction: float):
        self.index = index
        dev, work = scenario.device, scenario.workload
        over = scenario.overrides.get(index)
        self.power_limit = over.power_limit_watts if over and over.power_limit_watts else (
            dev.power_limit_watts)
        self.temperature_offset = over.temperature_offset_celsius if over else 0.0
        self.clock_scale = over.clock_scale if over else 1.0
        scale = over.power_scale if over else 1.0
        self.training = work.type == "training"
        high = min(work.compute_watts * scale, self.power_limit)
        low = work.communication_watts * scale if self.training else work.idle_watts * scale
        if not self.training:
            high = low
        self.wave = _Waveform(period, fraction, work.ramp_seconds, high, low)
        self.high = high
        self.phase = work.phase_seconds + (over.phase_seconds if over else 0.0)
        self.start = start
        # x measures time along the waveform; x0 is where this GPU's run began.
        self.x0 = (start + self.phase) % self.wave.period
        self.every = work.checkpoint_every_seconds if self.training else 0.0
        self.ckpt_seconds = min(work.checkpoint_seconds, self.every)
        self.writer = index == work.checkpoint_gpu
        self.ckpt_watts = work.idle_watts + 40 if self.writer else work.wait_watts
        self._ckpt_prefix = [0.0]  # energy corrections of completed checkpoints, summed
        self.energy0_mj = 1.2e9 + index * 3.7e7
        rng = np.random.default_rng(scenario.seed * 1000 + index)
        self.noise = rng.standard_normal(_NOISE_TABLE) * work.noise_watts
        self.uuid = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_OID, f"cte-{scenario.seed}-{index}"))
        self.serial = f"16522210{index:05d}"
        self.bus = _PCI_BUSES[index % len(_PCI_BUSES)] + (index // len(_PCI_BUSES))

    def recorded(self, name: str, t: float) -> float | None:
        """A replayed value of a sweep field (see sim/replay.py); None: use the model."""
        return None

    def in_checkpoint(self, t: float) -> bool:
        return self.every > 0 and t % self.every < self.ckpt_seconds

    def ideal_power(self, t: float) -> float:
        if self.in_checkpoint(t):
            return self.ckpt_watts
        return self.wave.value(t + self.phase)

    def instant_power(self, t: float, update_period: float) -> float:
        tick = math.floor(t / update_period)
        held = self.ideal_power(tick * update_period)
        return max(0.0, held + float(self.noise[tick % _NOISE_TABLE]))

    def _wave_energy(self, t: float) -> float:
        elapsed = max(0.0, t - self.start)
        return self.wave.integral(self.x0 + elapsed) - self.wave.integral(self.x0)

    def _checkpoint_correction(self, k: int, t: float) -> float:
        """Energy of checkpoint k up to t, minus the waveform's over the same time."""
        a = max(k * self.every, self.start)
        b = min(k * self.every + self.ckpt_seconds, t)
        if b <= a:
            return 0.0
        return self.ckpt_watts * (b - a) - (self._wave_energy(b) - self._wave_energy(a))

    def energy_joules(self, t: float) -> float:
        energy = self._wave_energy(t)
        if self.every <= 0 or t <= self.start:
            return energy
        first = math.floor(self.start / self.every)
        current = math.floor(t / self.every)
        while len(self._ckpt_prefix) <= current - first:  # completed checkpoints, once
            k = first + len(self._ckpt_prefix) - 1
            self._ckpt_prefix.append(self._ckpt_prefix[-1] + self._checkpoint_correction(
                k, math.inf))
        return energy + self._ckpt_prefix[current - first] + self._checkpoint_correction(
            current, t)

    def average_power(self, t: float, window: float) -> float:
        window = max(1e-3, min(window, t - self.start))
        if t - self.start < 1e-3:
            return self.ideal_power(t)
        return (self.energy_joules(t) - self.energy_joules(t - window)) / window


def _step_timing(scenario: Scenario) -> list[tuple[float, float]]:
    """(period, compute fraction) of each GPU. In lockstep training every GPU waits for the
    slowest one's compute phase, so a slow GPU stretches every peer's step."""
    work, overrides = scenario.workload, scenario.overrides
    n = scenario.gpus
    if any(o.step_period_seconds for o in overrides.values()):  # independent GPUs
        out = []
        for gpu in range(n):
            over = overrides.get(gpu)
            period = (over.step_period_seconds if over and over.step_period_seconds
                      else work.step_period_seconds)
            out.append((period, work.compute_fraction))
        return out
    compute = work.compute_fraction * work.step_period_seconds
    speeds = [overrides[g].clock_scale if g in overrides else 1.0 for g in range(n)]
    period = max(compute / s for s in speeds) + work.step_period_seconds - compute
    return [(period, min(0.98, compute / s / period)) for s in speeds]


_WAITING_SYMBOLS = frozenset({"nvmlEventSetWait_v2"})


class _Symbol:
    """A callable standing for one C symbol; pynvml may set attributes (restype) on it."""

    def __init__(self, lib: FakeNvmlLibrary, name: str, impl: Callable[..., int]):
        self.lib, self.name, self.impl = lib, name, impl

    def __call__(self, *args):
        lib = self.lib
        lib.calls[self.name] = lib.calls.get(self.name, 0) + 1
        if self.name in _WAITING_SYMBOLS:  # blocks by design: not the fake's CPU cost
            return self.impl(*args)
        t0 = time.thread_time()  # CPU time, not wall time: waits for the GIL are not ours
        try:
            fault = lib.fault_for(self.name, args)
            if fault is not None:
                return fault
            return self.impl(*args)
        finally:
            lib.busy_seconds += time.thread_time() - t0


class FakeNvmlLibrary:
    """Answers the NVML C symbols pynvml looks up, from a Scenario."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float] = time.time):
        self.nvml = pynvml  # the pynvml module it is installed under (install() sets it)
        self.scenario = scenario
        self.clock = clock
        self.start = clock()
        timing = _step_timing(scenario)
        self.gpus = [_FakeGpu(i, scenario, self.start, *timing[i]) for i in range(scenario.gpus)]
        self.initialized = 0
        self.calls: dict[str, int] = {}
        self.looked_up: set[str] = set()
        self.missing: set[str] = set()
        self.busy_seconds = 0.0  # time spent inside the fake (shown apart in benchmarks)
        self._released = threading.Event()
        self._hangs_done: set[int] = set()
        self._lock = threading.Lock()
        self._event_sets: dict[int, dict] = {}
        self._next_set = 0

    # -- plumbing ---------------------------------------------------------
    def __getattr__(self, name: str) -> _Symbol:
        impl = type(self).__dict__.get("_" + name)
        if impl is None or not name.startswith("nvml"):
            self.__dict__.setdefault("missing", set()).add(name)
            raise AttributeError(name)
        self.looked_up.add(name)
        return _Symbol(self, name, impl.__get__(self))

    def now(self) -> float:
        return self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def release_hangs(self) -> None:
        """Wake any call blocked by a hang fault (used on shutdown)."""
        self._released.set()

    def fault_for(self, call: str, args: tuple) -> int | None:
        """The return code of an active fault for this call, after any injected hang."""
        if not self.scenario.events:
            return None
        gpu = self._gpu_of(args[0]) if args else None
        t = self.elapsed()
        for number, event in enumerate(self.scenario.events):
            if not event.active(t) or not event.matches(call, gpu):
                continue
            if event.kind == "hang":
                with self._lock:
                    first = number not in self._hangs_done
                    self._hangs_done.add(number)
                if first:
                    self._released.wait(event.seconds)
            elif event.kind == "error" and (event.gpu is None or gpu == event.gpu):
                return ERROR_CODES[event.error]
        return None

    def _gpu_of(self, handle) -> int | None:
        if isinstance(handle, ctypes.c_uint):  # nvmlDeviceGetHandleByIndex_v2(index, ...)
            return handle.value if 0 <= handle.value < len(self.gpus) else None
        if not isinstance(handle, self.nvml.c_nvmlDevice_t):
            return None
        address = ctypes.cast(handle, ctypes.c_void_p).value or 0
        index = address - _HANDLE_BASE
        return index if 0 <= index < len(self.gpus) else None

    def faults(self, kind: str, gpu: int, t: float, *, started: bool = False) -> list[FaultEvent]:
        """Faults of a kind on a GPU: active at t, or (started=True) begun by t."""
        return [e for e in self.scenario.events
                if e.kind == kind and (e.gpu is None or e.gpu == gpu)
                and (t >= e.at if started else e.active(t))]

    def _count(self, kind: str, param: str, gpu: int, t: float) -> int:
        return int(sum(e.params[param] for e in self.faults(kind, gpu, t, started=True)))

    def _flag(self, kind: str, param: str, gpu: int, t: float) -> int:
        return int(any(e.params[param] for e in self.faults(kind, gpu, t)))

    def clock_events(self, gpu: _FakeGpu, t: float) -> tuple[int, float, float]:
        """Active fault reason bits, SM clock scale and extra degrees at time t."""
        bits, scale, hotter = 0, 1.0, 0.0
        for event in self.faults("clock_event", gpu.index, t - self.start):
            for reason in event.params["reasons"]:
                bits |= CLOCK_EVENT_BITS[reason]
            scale = min(scale, event.params["clock_scale"])
            hotter = max(hotter, event.params["temperature_offset_celsius"])
        return bits, scale, hotter

    def _nvlink_errors(self, gpu: int, link: int, param: str, t: float) -> int:
        total = 0.0
        for event in self.faults("nvlink", gpu, t, started=True):
            if event.params["link"] in (None, link):
                total += event.params[param] * event.active_seconds(t)
        return int(total)

    def _nvlink_up(self, gpu: int, link: int, t: float) -> bool:
        return not any(e.params["down"] and e.params["link"] in (None, link)
                       for e in self.faults("nvlink", gpu, t))

    def _gpu(self, handle) -> _FakeGpu | None:
        if self.initialized <= 0:
            return None
        index = self._gpu_of(handle)
        return None if index is None else self.gpus[index]

    def _device_call(self, handle, target, compute: Callable[[_FakeGpu], object]) -> int:
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        gpu = self._gpu(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        value = compute(gpu)
        if value is None:
            return ERROR_NOT_SUPPORTED
        _target(target).value = value
        return SUCCESS

    # -- library ----------------------------------------------------------
    def _nvmlInitWithFlags(self, flags) -> int:
        self.initialized += 1
        return SUCCESS

    def _nvmlInit_v2(self) -> int:
        return self._nvmlInitWithFlags(0)

    def _nvmlShutdown(self) -> int:
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        self.initialized -= 1
        return SUCCESS

    def _nvmlErrorString(self, result) -> bytes:
        code = result.value if hasattr(result, "value") else int(result)
        names = {v: k for k, v in ERROR_CODES.items()}
        return names.get(code, f"Error {code}").encode()

    def _string_call(self, buffer, size, text: str) -> int:
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        data = text.encode()
        if len(data) + 1 > _target(size).value:
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        buffer.value = data
        return SUCCESS

    def _nvmlSystemGetDriverVersion(self, buffer, size) -> int:
        return self._string_call(buffer, size, self.scenario.device.driver_version)

    def _nvmlSystemGetNVMLVersion(self, buffer, size) -> int:
        return self._string_call(buffer, size, self.scenario.device.nvml_version)

    def _nvmlDeviceGetCount_v2(self, count) -> int:
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        _target(count).value = len(self.gpus)
        return SUCCESS

    def _nvmlDeviceGetHandleByIndex_v2(self, index, device) -> int:
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        i = _target(index).value
        if not 0 <= i < len(self.gpus):
            return ERROR_INVALID_ARGUMENT
        pointer_value = ctypes.c_void_p(_HANDLE_BASE + i)
        ctypes.memmove(ctypes.addressof(_target(device)), ctypes.addressof(pointer_value),
                       ctypes.sizeof(ctypes.c_void_p))
        return SUCCESS

    # -- identity -----------------------------------------------------------
    def _nvmlDeviceGetIndex(self, handle, index) -> int:
        return self._device_call(handle, index, lambda g: g.index)

    def _device_string(self, handle, buffer, size, text: Callable[[_FakeGpu], str]) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return ERROR_UNINITIALIZED if self.initialized <= 0 else ERROR_INVALID_ARGUMENT
        return self._string_call(buffer, size, text(gpu))

    def _nvmlDeviceGetUUID(self, handle, buffer, size) -> int:
        return self._device_string(handle, buffer, size, lambda g: g.uuid)

    def _nvmlDeviceGetName(self, handle, buffer, size) -> int:
        return self._device_string(handle, buffer, size, lambda g: self.scenario.device.name)

    def _nvmlDeviceGetSerial(self, handle, buffer, size) -> int:
        return self._device_string(handle, buffer, size, lambda g: g.serial)

    def _nvmlDeviceGetPciInfo_v3(self, handle, info) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        target = _target(info)
        bus_id = f"00000000:{gpu.bus:02X}:00.0"
        target.busId = bus_id.encode()
        target.busIdLegacy = bus_id.encode()
        target.domain, target.bus, target.device = 0, gpu.bus, 0
        target.pciDeviceId = 0x233010DE
        target.pciSubSystemId = 0x16C110DE
        return SUCCESS

    # -- power --------------------------------------------------------------
    def _nvmlDeviceGetEnforcedPowerLimit(self, handle, limit) -> int:
        return self._device_call(handle, limit, lambda g: int(g.power_limit * 1000))

    def _nvmlDeviceGetPowerManagementLimit(self, handle, limit) -> int:
        return self._nvmlDeviceGetEnforcedPowerLimit(handle, limit)

    def _nvmlDeviceGetPowerManagementDefaultLimit(self, handle, limit) -> int:
        return self._device_call(
            handle, limit, lambda g: int(self.scenario.device.default_power_limit_watts * 1000))

    def _nvmlDeviceGetPowerUsage(self, handle, milliwatts) -> int:
        # Like Ampere and newer: a 1 s average, not the instant value.
        return self._device_call(
            handle, milliwatts, lambda g: int(g.average_power(self.now(), 1.0) * 1000))

    def _nvmlDeviceGetTotalEnergyConsumption(self, handle, millijoules) -> int:
        return self._device_call(handle, millijoules, lambda g: self._energy_mj(g))

    def _energy_mj(self, gpu: _FakeGpu) -> int:
        return int(gpu.energy0_mj + gpu.energy_joules(self.now()) * 1000)

    # -- load, memory, thermals, clocks ---------------------------------------
    def _compute_phase(self, gpu: _FakeGpu, t: float) -> bool:
        return gpu.training and gpu.ideal_power(t) > (gpu.high + gpu.wave.low) / 2

    def _nvmlDeviceGetUtilizationRates(self, handle, util) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        target, t = _target(util), self.now()
        writing = gpu.writer and gpu.in_checkpoint(t)
        target.gpu = 100 if gpu.training and not writing else 0
        target.memory = (55 if self._compute_phase(gpu, t) else 6) if gpu.training else 0
        for name, attr in (("utilization_gpu_ratio", "gpu"), ("utilization_memory_ratio",
                                                              "memory")):
            replayed = gpu.recorded(name, t)
            if replayed is not None:
                setattr(target, attr, int(round(replayed * 100)))
        return SUCCESS

    def _nvmlDeviceGetMemoryInfo(self, handle, memory) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        target = _target(memory)
        total = self.scenario.device.memory_total_bytes
        used = self.scenario.workload.memory_used_bytes if gpu.training else 512 * 1024**2
        used = int(gpu.recorded("memory_used_bytes", self.now()) or used)
        target.total, target.used, target.free = total, min(used, total), total - min(used, total)
        return SUCCESS

    def _temperature(self, gpu: _FakeGpu) -> float:
        t = self.now()
        replayed = gpu.recorded("temperature_celsius", t)
        if replayed is not None:
            return replayed
        load = gpu.average_power(t, 30.0)
        return 28.0 + 0.056 * load + gpu.temperature_offset + self.clock_events(gpu, t)[2]

    def _nvmlDeviceGetTemperature(self, handle, sensor, temp) -> int:
        if _target(sensor).value != pynvml.NVML_TEMPERATURE_GPU:
            return ERROR_INVALID_ARGUMENT
        return self._device_call(handle, temp, lambda g: int(round(self._temperature(g))))

    def _sm_clock(self, gpu: _FakeGpu) -> float:
        replayed = gpu.recorded("sm_clock_hertz", self.now())
        if replayed is not None:
            return replayed / 1e6
        dev = self.scenario.device
        if not gpu.training:
            return dev.idle_sm_clock_mhz
        t = self.now()
        capped = gpu.instant_power(t, dev.power_update_period_seconds) >= 0.98 * gpu.power_limit
        scale = gpu.clock_scale * self.clock_events(gpu, t)[1] * (0.93 if capped else 1.0)
        return round(dev.max_sm_clock_mhz * scale / 15) * 15

    def _nvmlDeviceGetClockInfo(self, handle, clock_type, mhz) -> int:
        kind = _target(clock_type).value
        dev = self.scenario.device
        if kind in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            return self._device_call(handle, mhz, lambda g: int(self._sm_clock(g)))
        if kind == pynvml.NVML_CLOCK_MEM:
            return self._device_call(handle, mhz, lambda g: int(dev.memory_clock_mhz))
        return self._device_call(handle, mhz, lambda g: None)

    def _nvmlDeviceGetMaxClockInfo(self, handle, clock_type, mhz) -> int:
        kind = _target(clock_type).value
        dev = self.scenario.device
        value = dev.memory_clock_mhz if kind == pynvml.NVML_CLOCK_MEM else dev.max_sm_clock_mhz
        return self._device_call(handle, mhz, lambda g: int(value))

    def _nvmlDeviceGetPerformanceState(self, handle, pstate) -> int:
        return self._device_call(handle, pstate, lambda g: 0)

    def _nvmlDeviceGetFanSpeed(self, handle, speed) -> int:
        return self._device_call(
            handle, speed, lambda g: 35 if self.scenario.device.has_fan else None)

    def _nvmlDeviceGetCurrentClocksEventReasons(self, handle, reasons) -> int:
        def compute(gpu: _FakeGpu) -> int:
            t = self.now()
            replayed = gpu.recorded("clock_event_reasons", t)
            if replayed is not None:
                return int(replayed)
            faults = self.clock_events(gpu, t)[0]
            if not gpu.training:
                return 0x1 | faults  # GPU idle
            dev = self.scenario.device
            at_cap = gpu.instant_power(t, dev.power_update_period_seconds) >= (
                0.98 * gpu.power_limit)
            return (0x4 if at_cap else 0x0) | faults  # SW power cap
        return self._device_call(handle, reasons, compute)

    def _nvmlDeviceGetCurrentClocksThrottleReasons(self, handle, reasons) -> int:
        return self._nvmlDeviceGetCurrentClocksEventReasons(handle, reasons)

    # -- PCIe -----------------------------------------------------------------
    def _nvmlDeviceGetCurrPcieLinkGeneration(self, handle, gen) -> int:
        return self._device_call(handle, gen, lambda g: self.scenario.device.pcie_generation)

    def _nvmlDeviceGetMaxPcieLinkGeneration(self, handle, gen) -> int:
        return self._nvmlDeviceGetCurrPcieLinkGeneration(handle, gen)

    def _nvmlDeviceGetCurrPcieLinkWidth(self, handle, width) -> int:
        return self._device_call(handle, width, lambda g: self.scenario.device.pcie_width)

    def _nvmlDeviceGetMaxPcieLinkWidth(self, handle, width) -> int:
        return self._nvmlDeviceGetCurrPcieLinkWidth(handle, width)

    def _nvmlDeviceGetPcieReplayCounter(self, handle, counter) -> int:
        return self._device_call(handle, counter, lambda g: 0)

    def _pcie_bytes(self, gpu: _FakeGpu, share: float) -> int:
        rate = self.scenario.workload.pcie_bytes_per_second if gpu.training else 1e5
        return int(max(0.0, self.now() - self.start) * rate * share) + 10**9 * (gpu.index + 1)

    # -- field values -----------------------------------------------------------
    def _field(self, gpu: _FakeGpu, field_id: int, scope: int, t: float
               ) -> tuple[int, float] | None:
        dev = self.scenario.device
        since = t - self.start
        health = self._health_field(gpu.index, field_id, since)
        if health is not None:
            return _ULL, health
        if field_id == FI_NVLINK_COUNT:
            return _UINT, dev.nvlinks
        link = FI_NVLINK_CRC_DATA.get(field_id, scope)
        if field_id in (FI_NVLINK_STATE, FI_NVLINK_REPLAY, FI_NVLINK_RECOVERY, FI_NVLINK_CRC,
                        FI_NVLINK_TX, FI_NVLINK_RX, *FI_NVLINK_CRC_DATA):
            if not 0 <= link < dev.nvlinks:
                return None
            return self._nvlink_field(gpu, field_id, link, since)
        if field_id == FI_POWER_INSTANT:
            return _UINT, int(gpu.instant_power(t, dev.power_update_period_seconds) * 1000)
        if field_id == FI_POWER_AVERAGE:
            return _UINT, int(gpu.average_power(t, 1.0) * 1000)
        if field_id == FI_TOTAL_ENERGY:
            return _ULL, self._energy_mj(gpu)
        if field_id == FI_POWER_LIMIT:
            return _UINT, int(gpu.power_limit * 1000)
        if field_id == FI_MEMORY_TEMP:
            replayed = gpu.recorded("memory_temperature_celsius", t)
            return _UINT, int(round(replayed if replayed is not None
                                    else self._temperature(gpu) + 6))
        if field_id == FI_PCIE_REPLAY:
            return _UINT, 0
        if field_id == FI_PCIE_TX:
            return _ULL, self._pcie_bytes(gpu, 0.55)
        if field_id == FI_PCIE_RX:
            return _ULL, self._pcie_bytes(gpu, 0.45)
        return None

    def _health_field(self, gpu: int, field_id: int, since: float) -> int | None:
        """ECC, retired pages, remapped rows and recovery action, from the faults so far."""
        counts = {
            FI_ECC_SBE_VOL: ("ecc", "corrected"), FI_ECC_SBE_AGG: ("ecc", "corrected"),
            FI_ECC_DBE_VOL: ("ecc", "uncorrected"), FI_ECC_DBE_AGG: ("ecc", "uncorrected"),
            FI_RETIRED_SBE: ("retired_pages", "single_bit"),
            FI_RETIRED_DBE: ("retired_pages", "double_bit"),
            FI_REMAPPED_COR: ("row_remap", "correctable"),
            FI_REMAPPED_UNC: ("row_remap", "uncorrectable"),
        }
        if field_id in counts:
            return self._count(*counts[field_id], gpu, since)
        flags = {FI_RETIRED_PENDING: ("retired_pages", "pending"),
                 FI_REMAPPED_PENDING: ("row_remap", "pending"),
                 FI_REMAPPED_FAILURE: ("row_remap", "failure")}
        if field_id in flags:
            return self._flag(*flags[field_id], gpu, since)
        if field_id == FI_ECC_CURRENT:
            return 1
        if field_id == FI_RECOVERY_ACTION:
            actions = self.faults("recovery_action", gpu, since)
            return RECOVERY_ACTIONS[actions[-1].params["action"]] if actions else 0
        return None

    def _nvlink_field(self, gpu: _FakeGpu, field_id: int, link: int, since: float
                      ) -> tuple[int, float]:
        up = self._nvlink_up(gpu.index, link, since)
        if field_id == FI_NVLINK_STATE:
            return _UINT, int(up)
        if field_id in (FI_NVLINK_TX, FI_NVLINK_RX):  # KiB counters
            rate = NVLINK_BYTES_PER_SECOND if gpu.training and up else 0.0
            return _ULL, int(max(0.0, since) * rate / 1024) + 1000 * (link + 1)
        param = {FI_NVLINK_REPLAY: "replay_per_second",
                 FI_NVLINK_RECOVERY: "recovery_per_second",
                 FI_NVLINK_CRC: "crc_flit_per_second"}.get(field_id, "crc_data_per_second")
        return _ULL, self._nvlink_errors(gpu.index, link, param, since)

    def _nvmlDeviceGetNvLinkErrorCounter(self, handle, link, counter, result) -> int:
        kinds = {pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay_per_second",
                 pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery_per_second",
                 pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit_per_second",
                 pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data_per_second"}
        link_no = link if isinstance(link, int) else _target(link).value
        kind = kinds.get(counter if isinstance(counter, int) else _target(counter).value)
        if kind is None or not 0 <= link_no < self.scenario.device.nvlinks:
            return ERROR_INVALID_ARGUMENT
        return self._device_call(handle, result, lambda g: self._nvlink_errors(
            g.index, link_no, kind, self.elapsed()))

    def _nvmlDeviceGetNvLinkState(self, handle, link, active) -> int:
        link_no = link if isinstance(link, int) else _target(link).value
        if not 0 <= link_no < self.scenario.device.nvlinks:
            return ERROR_INVALID_ARGUMENT
        return self._device_call(handle, active,
                                 lambda g: int(self._nvlink_up(g.index, link_no, self.elapsed())))

    # -- events (XIDs) -------------------------------------------------------------
    def _nvmlEventSetCreate(self, event_set) -> int:
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        with self._lock:
            self._next_set += 1
            number = self._next_set
            self._event_sets[number] = {"gpus": set(), "delivered": set()}
        pointer_value = ctypes.c_void_p(_EVENT_SET_BASE + number)
        ctypes.memmove(ctypes.addressof(_target(event_set)), ctypes.addressof(pointer_value),
                       ctypes.sizeof(ctypes.c_void_p))
        return SUCCESS

    def _event_set(self, event_set) -> dict | None:
        address = ctypes.cast(event_set, ctypes.c_void_p).value or 0
        return self._event_sets.get(address - _EVENT_SET_BASE)

    def _nvmlDeviceRegisterEvents(self, handle, event_types, event_set) -> int:
        gpu = self._gpu(handle)
        registry = self._event_set(event_set)
        if gpu is None or registry is None:
            return ERROR_INVALID_ARGUMENT
        mask = _target(event_types).value
        if mask & ~pynvml.nvmlEventTypeXidCriticalError:
            return ERROR_NOT_SUPPORTED  # like NVML: one unsupported bit registers nothing
        registry["gpus"].add(gpu.index)
        return SUCCESS

    def _due_xid(self, registry: dict) -> tuple[int, FaultEvent] | None:
        t = self.elapsed()
        for number, event in enumerate(self.scenario.events):
            if (event.kind == "xid" and t >= event.at and number not in registry["delivered"]
                    and (event.gpu is None or event.gpu in registry["gpus"])):
                return number, event
        return None

    def _nvmlEventSetWait_v2(self, event_set, data, timeout_ms) -> int:
        registry = self._event_set(event_set)
        if registry is None:
            return ERROR_INVALID_ARGUMENT
        deadline = time.monotonic() + _target(timeout_ms).value / 1000.0
        while True:
            with self._lock:
                due = self._due_xid(registry)
                if due is not None:
                    number, event = due
                    registry["delivered"].add(number)
            if due is not None:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                return pynvml.NVML_ERROR_TIMEOUT
            # sleep until the next XID is due (checked at least every 50 ms while one is
            # pending, since the fake's clock may run faster than the wall clock)
            pending = any(e.kind == "xid" and n not in registry["delivered"]
                          for n, e in enumerate(self.scenario.events))
            if self._released.wait(min(left, 0.05) if pending else left):
                return pynvml.NVML_ERROR_TIMEOUT
        target = _target(data)
        gpu = event.gpu if event.gpu is not None else min(registry["gpus"])
        pointer_value = ctypes.c_void_p(_HANDLE_BASE + gpu)
        ctypes.memmove(ctypes.addressof(target.device), ctypes.addressof(pointer_value),
                       ctypes.sizeof(ctypes.c_void_p))
        target.eventType = pynvml.nvmlEventTypeXidCriticalError
        target.eventData = event.params["code"]
        return SUCCESS

    def _nvmlEventSetFree(self, event_set) -> int:
        address = ctypes.cast(event_set, ctypes.c_void_p).value or 0
        with self._lock:
            return SUCCESS if self._event_sets.pop(address - _EVENT_SET_BASE, None) else (
                ERROR_INVALID_ARGUMENT)

    def _nvmlDeviceGetFieldValues(self, handle, count, values) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return ERROR_UNINITIALIZED if self.initialized <= 0 else ERROR_INVALID_ARGUMENT
        array = _target(values)
        t = self.now()
        for i in range(_target(count).value):
            entry = array[i]
            entry.timestamp = int(t * 1e6)
            entry.latencyUsec = 0
            served = self._field(gpu, entry.fieldId, entry.scopeId, t)
            if served is None:
                entry.nvmlReturn = ERROR_NOT_SUPPORTED
                continue
            value_type, value = served
            entry.valueType = value_type
            entry.nvmlReturn = SUCCESS
            if value_type == _ULL:
                entry.value.ullVal = value
            else:
                entry.value.uiVal = value
        return SUCCESS


# -- installing under pynvml -------------------------------------------------------
_HOOKED_GLOBALS = ("nvmlLib", "_nvmlGetFunctionPointer_cache", "_nvmlLib_refcount",
                   "libLoadLock")


def check_hook(nvml: ModuleType = pynvml) -> None:
    """Fail loudly if this nvidia-ml-py no longer has the globals the fake replaces."""
    missing = [name for name in _HOOKED_GLOBALS if not hasattr(nvml, name)]
    cache = getattr(nvml, "_nvmlGetFunctionPointer_cache", None)
    if missing or not isinstance(cache, dict):
        raise FakeHookError(
            "this nvidia-ml-py release changed how it loads the driver library "
            f"(missing: {', '.join(missing) or '_nvmlGetFunctionPointer_cache as dict'}); "
            "the fake NVML cannot hook it: pin a tested release (see pyproject.toml)"
        )


def install(lib: FakeNvmlLibrary, nvml: ModuleType = pynvml) -> None:
    """Put the fake under pynvml (or a private copy of it). Refuses if a real driver
    library is already loaded there."""
    check_hook(nvml)
    with nvml.libLoadLock:
        current = nvml.nvmlLib
        if current is not None and not isinstance(current, FakeNvmlLibrary):
            raise RuntimeError("a real NVML library is already loaded; not replacing it")
        lib.nvml = nvml
        nvml.nvmlLib = lib
        nvml._nvmlGetFunctionPointer_cache.clear()
        nvml._nvmlLib_refcount = 0


def uninstall(nvml: ModuleType = pynvml) -> None:
    """Remove the fake, leaving pynvml as if nothing had been loaded."""
    with nvml.libLoadLock:
        lib = nvml.nvmlLib
        if isinstance(lib, FakeNvmlLibrary):
            lib.release_hangs()
            nvml.nvmlLib = None
        nvml._nvmlGetFunctionPointer_cache.clear()
        nvml._nvmlLib_refcount = 0


@contextmanager
def installed(scenario: Scenario, clock: Callable[[], float] = time.time):
    lib = FakeNvmlLibrary(scenario, clock)
    install(lib)
    try:
        yield lib
    finally:
        uninstall()
