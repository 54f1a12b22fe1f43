"""The fake's per-device getters: identity, power, the power-sample buffer, load, memory,
thermals, clocks and PCIe. Each answers a catalogue value through FakeNvmlLibrary.answer
(sim/fake.py), or fills the struct pynvml passes.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pynvml

from exporter.gpu import fields as fi
from exporter.gpu.batched import SAMPLE_DTYPE
from exporter.sim.cstructs import target, value_of
from exporter.sim.fake_core import FakeCore
from exporter.sim.scenarios import ERROR_CODES, FABRIC_STATES
from exporter.sim.tenants import uuid5_oid, uuid_text

SUCCESS, ERROR_UNINITIALIZED, ERROR_INVALID_ARGUMENT, ERROR_NOT_SUPPORTED = 0, 1, 2, 3
ERROR_NOT_FOUND = 6
ERROR_ARGUMENT_VERSION_MISMATCH = 25
NOT_AVAILABLE = 0xFFFFFFFF  # nvml.h NVML_VALUE_NOT_AVAILABLE in an unsigned int member
NVML_TEMPERATURE_GPU = 0
_CLOCK_KEYS = {pynvml.NVML_CLOCK_SM: "sm_clock_hertz", pynvml.NVML_CLOCK_GRAPHICS:
               "sm_clock_hertz", pynvml.NVML_CLOCK_MEM: "memory_clock_hertz"}


class DeviceSymbols(FakeCore):
    """Mixin of FakeNvmlLibrary."""

    # -- identity -----------------------------------------------------------
    def _nvmlDeviceGetIndex(self, handle, index) -> int:
        return self.device_call(handle, index, lambda g: g.index)

    def _nvmlDeviceGetMinorNumber(self, handle, minor) -> int:
        return self.device_call(handle, minor, lambda g: g.minor)

    def _device_string(self, handle, buffer, size, text) -> int:
        gpu = self.gpu(handle)
        if gpu is None:
            return ERROR_UNINITIALIZED if self.initialized <= 0 else ERROR_INVALID_ARGUMENT
        return self.string_call(buffer, size, text(gpu))

    def _nvmlDeviceGetUUID(self, handle, buffer, size) -> int:
        mig = self.mig_uuid_of(handle)
        if mig is not None:
            return self.string_call(buffer, size, mig)
        return self._device_string(handle, buffer, size, lambda g: self._swapped(g)[1])

    def _swapped(self, gpu) -> tuple[str, str]:
        """The GPU's serial and UUID, those of its replacement once a `replace` began."""
        events = self.faults("replace", gpu.index, self.elapsed(), started=True)
        if not events:
            return gpu.serial, gpu.uuid
        serial = max(events, key=lambda e: e.at).params["serial"]
        return serial, "GPU-" + uuid_text(uuid5_oid(f"cte-{serial}"))

    def _nvmlDeviceGetName(self, handle, buffer, size) -> int:
        # a replayed GPU has the name its trace recorded; the fake's share the scenario's
        return self._device_string(handle, buffer, size,
                                   lambda g: getattr(g, "name", self.scenario.device.name))

    def _nvmlDeviceGetSerial(self, handle, buffer, size) -> int:
        return self._device_string(handle, buffer, size, lambda g: self._swapped(g)[0])

    def _nvmlDeviceGetPciInfo_v3(self, handle, info) -> int:
        gpu = self.gpu(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        out = target(info)
        bus_id = f"00000000:{gpu.bus:02X}:00.0"
        out.busId = bus_id.encode()
        out.busIdLegacy = bus_id.encode()
        out.domain, out.bus, out.device = 0, gpu.bus, 0
        out.pciDeviceId = 0x233010DE
        out.pciSubSystemId = 0x16C110DE
        return SUCCESS

    # -- power --------------------------------------------------------------
    def _nvmlDeviceGetEnforcedPowerLimit(self, handle, limit) -> int:
        return self.answer(handle, limit, "power_limit_watts")

    def _nvmlDeviceGetPowerManagementLimit(self, handle, limit) -> int:
        return self.answer(handle, limit, "power_limit_watts")

    def _nvmlDeviceGetPowerManagementDefaultLimit(self, handle, limit) -> int:
        return self.answer(handle, limit, "default_power_limit_watts")

    def _nvmlDeviceGetPowerUsage(self, handle, milliwatts) -> int:
        # Like Ampere and newer: a 1 s average, not the instant value.
        return self.answer(handle, milliwatts, "power_average_watts")

    def _nvmlDeviceGetTotalEnergyConsumption(self, handle, millijoules) -> int:
        return self.answer(handle, millijoules, "energy_joules")

    def _nvmlDeviceGetSamples(self, handle, sampling_type, last_seen, value_type, count,
                              samples) -> int:
        """The driver's buffer of power samples: the newest `power_sample_buffer` of
        them taken after `last_seen` (us), oldest first; NotFound when there is none."""
        gpu = self.gpu(handle)
        if gpu is None:
            return ERROR_UNINITIALIZED if self.initialized <= 0 else ERROR_INVALID_ARGUMENT
        dev = self.scenario.device
        capacity = dev.power_sample_buffer
        if value_of(sampling_type) != fi.TOTAL_POWER_SAMPLES or capacity <= 0 or (
                not gpu.provides("power_watts")):
            return ERROR_NOT_SUPPORTED
        now, seen = self.now(), value_of(last_seen)
        # the driver sampled before the exporter started: its buffer is full from the start
        oldest = now - 2 * capacity * dev.power_sample_interval_seconds
        span = gpu.samples_between(max(seen / 1e6 - 1e-3, oldest), now)
        # the samples stamped after `seen` (stamps never decrease: a suffix of the span,
        # found by stamping its first one or two), the newest `capacity` of them
        first, stop = span.start, span.stop
        while first < stop and gpu.sample_stamp(first) <= seen:
            first += 1
        first = max(first, stop - capacity)
        if first >= stop:
            return ERROR_NOT_FOUND
        target(value_type).value = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        out_count = target(count)
        if samples is None:  # pynvml's first call asks how many to allocate
            out_count.value = stop - first
            self.charge_later(0)
            return SUCCESS
        n = min(out_count.value, stop - first)
        times, watts = gpu.samples_run(first, n)
        view = np.frombuffer(memoryview(samples).cast("B"), SAMPLE_DTYPE)
        # rint is np.round's whole-number rounding; the assignment casts as astype would
        view["timeStamp"][:n] = np.rint(times * 1e6)
        view["value"][:n] = np.rint(watts * 1000)
        out_count.value = n
        self.charge_later(n)
        return SUCCESS

    def charge_later(self, samples: int) -> None:
        """A drain costs more the more samples it returns (sim/costs.py)."""
        if self.costs is not None:
            self.pending_cost = self.costs.of_samples(samples)

    # -- load, memory, thermals, clocks ---------------------------------------
    def _nvmlDeviceGetUtilizationRates(self, handle, util) -> int:
        gpu = self.gpu(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        if self.scenario.mig and self.mig_instances(gpu.index):
            return ERROR_NOT_SUPPORTED  # as NVML answers for a GPU in MIG mode
        busy = self.nvml_units(gpu, "utilization_gpu_ratio")
        memory = self.nvml_units(gpu, "utilization_memory_ratio")
        if busy is None and memory is None:
            return ERROR_NOT_SUPPORTED
        out = target(util)
        out.gpu = NOT_AVAILABLE if busy is None else busy
        out.memory = NOT_AVAILABLE if memory is None else memory
        return SUCCESS

    def _nvmlDeviceGetMemoryInfo(self, handle, memory) -> int:
        gpu = self.gpu(handle)
        if gpu is None:
            mig = self.mig_memory(handle)
            if mig is None:
                return ERROR_INVALID_ARGUMENT
            out = target(memory)  # a MIG device: its GPU instance's memory
            out.total, out.used, out.free = mig[0], mig[1], mig[0] - mig[1]
            return SUCCESS
        used = self.nvml_units(gpu, "memory_used_bytes")
        total = self.nvml_units(gpu, "memory_total_bytes")
        if used is None and total is None:
            return ERROR_NOT_SUPPORTED
        out = target(memory)
        if used is None or total is None:  # a replayed trace with one of them
            na = 0xFFFFFFFFFFFFFFFF
            out.total, out.used, out.free = total if total is not None else na, (
                used if used is not None else na), na
            return SUCCESS
        # v1's used is total - free: the driver's reservation counted in, as v2 tells it
        free = self.nvml_units(gpu, "memory_free_bytes")
        used = min(used, total) if free is None else total - free
        out.total, out.used, out.free = total, used, total - used
        return SUCCESS

    def _nvmlDeviceGetMemoryInfo_v2(self, handle, memory) -> int:
        """Version 2 tells reserved memory apart: used (v2) + reserved + free = total."""
        gpu = self.gpu(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        out = target(memory)
        if out.version != pynvml.nvmlMemory_v2:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        keys = ("memory_total_bytes", "memory_reserved_bytes", "memory_free_bytes")
        total, reserved, free = (self.nvml_units(gpu, k) for k in keys)
        if total is None or reserved is None or free is None:
            return ERROR_NOT_SUPPORTED
        out.total, out.reserved, out.free = total, reserved, free
        out.used = max(0, total - reserved - free)
        return SUCCESS

    def _video_utilization(self, handle, util, period, key: str) -> int:
        result = self.answer(handle, util, key)
        if result == SUCCESS:
            target(period).value = 167_000  # us: the driver's sample period
        return result

    def _nvmlDeviceGetEncoderUtilization(self, handle, util, period) -> int:
        return self._video_utilization(handle, util, period, "encoder_utilization_ratio")

    def _nvmlDeviceGetDecoderUtilization(self, handle, util, period) -> int:
        return self._video_utilization(handle, util, period, "decoder_utilization_ratio")

    def _nvmlDeviceGetTemperature(self, handle, sensor, temp) -> int:
        if value_of(sensor) != NVML_TEMPERATURE_GPU:
            return ERROR_INVALID_ARGUMENT
        return self.answer(handle, temp, "temperature_celsius")

    def _nvmlDeviceGetClockInfo(self, handle, clock_type, mhz) -> int:
        key = _CLOCK_KEYS.get(value_of(clock_type))
        if key is None:
            return self.device_call(handle, mhz, lambda g: None)
        return self.answer(handle, mhz, key)

    def _nvmlDeviceGetMaxClockInfo(self, handle, clock_type, mhz) -> int:
        if value_of(clock_type) == pynvml.NVML_CLOCK_MEM:
            return self.answer(handle, mhz, "memory_clock_hertz")
        return self.answer(handle, mhz, "sm_clock_max_hertz")

    def _nvmlDeviceGetPerformanceState(self, handle, pstate) -> int:
        return self.answer(handle, pstate, "performance_state")

    def _nvmlDeviceGetFanSpeed(self, handle, speed) -> int:
        return self.answer(handle, speed, "fan_speed_ratio")

    def _nvmlDeviceGetCurrentClocksEventReasons(self, handle, reasons) -> int:
        return self.answer(handle, reasons, "clock_event_reasons")

    def _nvmlDeviceGetCurrentClocksThrottleReasons(self, handle, reasons) -> int:
        return self.answer(handle, reasons, "clock_event_reasons")

    # -- PCIe -----------------------------------------------------------------
    def _nvmlDeviceGetCurrPcieLinkGeneration(self, handle, gen) -> int:
        return self.answer(handle, gen, "pcie_generation")

    def _nvmlDeviceGetMaxPcieLinkGeneration(self, handle, gen) -> int:
        return self.answer(handle, gen, "pcie_max_generation")

    def _nvmlDeviceGetCurrPcieLinkWidth(self, handle, width) -> int:
        return self.answer(handle, width, "pcie_width")

    def _nvmlDeviceGetMaxPcieLinkWidth(self, handle, width) -> int:
        return self.answer(handle, width, "pcie_max_width")

    def _nvmlDeviceGetPcieReplayCounter(self, handle, counter) -> int:
        return self.answer(handle, counter, "pcie_replays")


    # -- board: NVLink fabric and InfoROM -------------------------------------
    def _nvmlDeviceGetGpuFabricInfoV(self, handle, info) -> int:
        """An NVSwitch system's GPU registered with the fabric (state completed), unless
        a `fabric` fault says otherwise; a PCIe card (device fabric: false) reads
        not_supported, as the driver answers there."""
        gpu = self.gpu(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        out = target(info)
        if out.version != self.nvml.nvmlGpuFabricInfo_v2:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        state, status, degraded = "completed", "Success", False
        if not self.scenario.device.fabric:
            state = "not_supported"
        for fault in self.faults("fabric", gpu.index, self.elapsed()):
            state, status = fault.params["state"], fault.params["status"]
            degraded = degraded or fault.params["degraded"]
        out.state = FABRIC_STATES[state]
        out.status = 0 if status == "Success" else ERROR_CODES[status]
        registered = state == "completed"
        out.cliqueId = 1 if registered else 0
        cluster = uuid5_oid(f"cte-fabric-{self.scenario.seed}")
        ctypes.memmove(out.clusterUuid, cluster if registered else bytes(16), 16)
        # health mask: each field "false" (2) when healthy, degraded bandwidth "true" (1)
        healthy = 2 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8
        out.healthMask = (healthy & ~0x3 | 1) if degraded else healthy
        return SUCCESS

    def _nvmlDeviceValidateInforom(self, handle) -> int:
        # a corrupt InfoROM: an `error` fault on this call with error CorruptedInforom
        return ERROR_INVALID_ARGUMENT if self.gpu(handle) is None else SUCCESS
