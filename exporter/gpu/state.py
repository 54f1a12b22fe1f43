"""GPU source: what the exporter reads from each GPU, as plain dataclasses.

Three reads of different cost and cadence:
- read_identity: once at start (and when a GPU comes back).
- read_power: the fast loop (default 20 Hz): instant power and the energy
  counter in one batched nvmlDeviceGetFieldValues call.
- read_state: the full sweep (default 1 s).
A value NVML cannot give is None and was counted by the backend.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

import pynvml

from exporter.gpu.backend import NvmlBackend

FI = pynvml  # field-id constants live on the pynvml module

POWER_FIELDS = (FI.NVML_FI_DEV_POWER_INSTANT, FI.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)
SWEEP_FIELDS = (
    FI.NVML_FI_DEV_POWER_AVERAGE,
    FI.NVML_FI_DEV_MEMORY_TEMP,
    FI.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    FI.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    FI.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
)


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    serial: str
    default_power_limit_watts: float | None
    pcie_max_generation: int | None
    pcie_max_width: int | None
    sm_clock_max_hertz: float | None
    nvlinks: int = 0  # NVLinks the GPU has (field 91): the ones that should be active


@dataclass(frozen=True)
class PowerSample:
    time: float  # seconds since the epoch, when the exporter read it
    watts: float | None  # instant power
    joules: float | None  # total energy since driver load


@dataclass(frozen=True)
class GpuState:
    time: float
    utilization_gpu_ratio: float | None = None
    utilization_memory_ratio: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_average_watts: float | None = None
    power_limit_watts: float | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    performance_state: int | None = None
    fan_speed_ratio: float | None = None
    pcie_transmit_bytes: float | None = None
    pcie_receive_bytes: float | None = None
    pcie_replays: float | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    clock_event_reasons: int | None = None  # bitmask of nvmlClocksEventReason*


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def read_identity(backend: NvmlBackend, gpu: int) -> GpuIdentity | None:
    handle = backend.handle(gpu)
    if handle is None:
        return None
    call = partial(backend.call, gpu=gpu)
    uuid = call("nvmlDeviceGetUUID", handle)
    if uuid is None:
        return None  # without a UUID there is no stable identity to label series with
    pci = call("nvmlDeviceGetPciInfo", handle)
    bus_id = pci.busId if pci is not None else ""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode(errors="replace")
    default_limit = call("nvmlDeviceGetPowerManagementDefaultLimit",
                         handle)
    max_sm = call("nvmlDeviceGetMaxClockInfo", handle, pynvml.NVML_CLOCK_SM)
    links = backend.fields(gpu, [FI.NVML_FI_DEV_NVLINK_LINK_COUNT]).get(
        FI.NVML_FI_DEV_NVLINK_LINK_COUNT)
    return GpuIdentity(
        index=gpu,
        uuid=uuid,
        name=call("nvmlDeviceGetName", handle) or "",
        pci_bus_id=bus_id,
        serial=call("nvmlDeviceGetSerial", handle) or "",
        default_power_limit_watts=_scaled(default_limit, 1e-3),
        pcie_max_generation=call("nvmlDeviceGetMaxPcieLinkGeneration",
                                 handle),
        pcie_max_width=call("nvmlDeviceGetMaxPcieLinkWidth",
                            handle),
        sm_clock_max_hertz=_scaled(max_sm, 1e6),
        nvlinks=0 if links is None else int(links.value),
    )


def read_power(backend: NvmlBackend, gpu: int) -> PowerSample:
    fields = backend.fields(gpu, POWER_FIELDS)
    now = time.time()
    power = fields.get(FI.NVML_FI_DEV_POWER_INSTANT)
    energy = fields.get(FI.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)
    return PowerSample(
        time=now,
        watts=None if power is None else power.value / 1000.0,
        joules=None if energy is None else energy.value / 1000.0,
    )


def read_state(backend: NvmlBackend, gpu: int, previous: GpuState | None = None
               ) -> GpuState | None:
    """The sweep of one GPU; None when its handle cannot be had.

    With `previous`, the values that change seldom (enforced power limit, P-state, PCIe
    link generation and width) are carried over instead of read: the sampler re-reads
    them at the health interval."""
    handle = backend.handle(gpu)
    if handle is None:
        return None
    call = partial(backend.call, gpu=gpu)
    fields = backend.fields(gpu, SWEEP_FIELDS)

    def field(field_id: int, factor: float = 1.0) -> float | None:
        reading = fields.get(field_id)
        return None if reading is None else reading.value * factor

    util = call("nvmlDeviceGetUtilizationRates", handle)
    memory = call("nvmlDeviceGetMemoryInfo", handle)
    fan = call("nvmlDeviceGetFanSpeed", handle)
    temperature = call("nvmlDeviceGetTemperature", handle,
                       pynvml.NVML_TEMPERATURE_GPU)
    sm_clock = call("nvmlDeviceGetClockInfo", handle,
                    pynvml.NVML_CLOCK_SM)
    mem_clock = call("nvmlDeviceGetClockInfo", handle,
                     pynvml.NVML_CLOCK_MEM)
    if previous is None:
        limit = _scaled(call("nvmlDeviceGetEnforcedPowerLimit", handle), 1e-3)
        pstate = call("nvmlDeviceGetPerformanceState", handle)
        generation = call("nvmlDeviceGetCurrPcieLinkGeneration", handle)
        width = call("nvmlDeviceGetCurrPcieLinkWidth", handle)
    else:
        limit, pstate = previous.power_limit_watts, previous.performance_state
        generation, width = previous.pcie_generation, previous.pcie_width
    return GpuState(
        time=time.time(),
        utilization_gpu_ratio=None if util is None else util.gpu / 100.0,
        utilization_memory_ratio=None if util is None else util.memory / 100.0,
        memory_used_bytes=None if memory is None else float(memory.used),
        memory_total_bytes=None if memory is None else float(memory.total),
        power_average_watts=field(FI.NVML_FI_DEV_POWER_AVERAGE, 1e-3),
        power_limit_watts=limit,
        temperature_celsius=None if temperature is None else float(temperature),
        memory_temperature_celsius=field(FI.NVML_FI_DEV_MEMORY_TEMP),
        sm_clock_hertz=_scaled(sm_clock, 1e6),
        memory_clock_hertz=_scaled(mem_clock, 1e6),
        performance_state=pstate,
        fan_speed_ratio=None if fan is None else fan / 100.0,
        pcie_transmit_bytes=field(FI.NVML_FI_DEV_PCIE_COUNT_TX_BYTES),
        pcie_receive_bytes=field(FI.NVML_FI_DEV_PCIE_COUNT_RX_BYTES),
        pcie_replays=field(FI.NVML_FI_DEV_PCIE_REPLAY_COUNTER),
        pcie_generation=generation,
        clock_event_reasons=call("nvmlDeviceGetCurrentClocksEventReasons", handle),
        pcie_width=width,
    )
