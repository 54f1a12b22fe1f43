"""The catalogue of per-GPU values: what to read, how often, and what it is called.

One entry per value: where NVML has it (a field id, or a call and the struct member of
its answer), the factor to base units, how often it is read, its metric name and help,
and whether traces carry it. The sweep reads from here, the renderer writes the GPU
families from here, `record` and replay take their columns from here, and the fake
answers each field and call with its model's value divided by the same factor. A new
per-GPU metric is one entry.

Cadence, chosen by what each read costs on a real H200 (exporter/sim/costs.py):
- once: at start and when a lost GPU comes back (static: limits, maximum clocks);
- sweep: every sweep (default 1 s): the cheap getters, 1-8 us each;
- health: every health interval (default 5 s): slowly changing values and the PCIe
  counters, 80-170 us per field;
- energy: every energy interval (default 30 s): the energy counter, ~4 ms of CPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from exporter.gpu import fields as fi

ONCE, SWEEP, HEALTH, ENERGY = "once", "sweep", "health", "energy"
CADENCES = (ONCE, SWEEP, HEALTH, ENERGY)

# nvml.h constants used as call arguments
TEMPERATURE_GPU = 0
CLOCK_SM, CLOCK_MEM = 1, 2
MEMORY_INFO_V2 = 0x02000028  # nvmlMemory_v2: nvmlDeviceGetMemoryInfo_v2, with `reserved`


@dataclass(frozen=True)
class Field:
    """A value read through nvmlDeviceGetFieldValues (batched per GPU and cadence)."""

    id: int


@dataclass(frozen=True)
class Call:
    """A value read through a pynvml call on the GPU's handle; `member` is the attribute
    of a struct answer, or the index in a list answer (None: the answer is the value).
    One call serves every value that names it within a read."""

    name: str
    args: tuple[int, ...] = ()
    member: str | int | None = None


@dataclass(frozen=True)
class GpuValue:
    key: str  # base-unit name: the state's key and the trace column
    nvml: Field | Call  # the NVML field or call that reads it
    scale: float  # NVML's unit -> base unit
    cadence: str
    metric: str | None  # None: read but rendered elsewhere (clock-event bits)
    help: str = ""
    kind: str = "gauge"  # or "counter"
    trace: bool = False  # recorded by `record`, replayed by `run --replay`
    # (label, value): this value is one series of a family that several entries share
    label: tuple[str, str] | None = None


CLOCK_EVENT_DRIVER = "gpu_clock_event_driver_seconds"
CLOCK_EVENT_DRIVER_HELP = ("Time the driver counted the clocks held down for a reason "
                           "(its own violation counters; `thermal`: any thermal capping).")

V = GpuValue
CATALOGUE: tuple[GpuValue, ...] = (
    # static
    V("default_power_limit_watts", Call("nvmlDeviceGetPowerManagementDefaultLimit"), 1e-3,
      ONCE, "gpu_power_default_limit_watts", "Default power limit (the board's TDP)."),
    V("pcie_max_generation", Call("nvmlDeviceGetMaxPcieLinkGeneration"), 1, ONCE,
      "gpu_pcie_link_max_generation", "Maximum PCIe link generation of the GPU and slot."),
    V("pcie_max_width", Call("nvmlDeviceGetMaxPcieLinkWidth"), 1, ONCE,
      "gpu_pcie_link_max_width", "Maximum PCIe link width (lanes)."),
    V("sm_clock_max_hertz", Call("nvmlDeviceGetMaxClockInfo", (CLOCK_SM,)), 1e6, ONCE,
      "gpu_sm_clock_max_hertz", "Maximum SM clock."),
    # every sweep
    V("utilization_gpu_ratio", Call("nvmlDeviceGetUtilizationRates", member="gpu"), 0.01,
      SWEEP, "gpu_utilization_ratio", "Share of time a kernel was running (0-1).",
      trace=True),
    V("utilization_memory_ratio", Call("nvmlDeviceGetUtilizationRates", member="memory"),
      0.01, SWEEP, "gpu_memory_utilization_ratio",
      "Share of time device memory was read or written (0-1).", trace=True),
    V("memory_used_bytes", Call("nvmlDeviceGetMemoryInfo", member="used"), 1, SWEEP,
      "gpu_memory_used_bytes", "Device memory in use.", trace=True),
    V("memory_total_bytes", Call("nvmlDeviceGetMemoryInfo", member="total"), 1, SWEEP,
      "gpu_memory_total_bytes", "Device memory in total."),
    V("power_average_watts", Field(fi.POWER_AVERAGE), 1e-3, SWEEP, "gpu_power_average_watts",
      "Power averaged by the driver over about 1 s.", trace=True),
    V("temperature_celsius", Call("nvmlDeviceGetTemperature", (TEMPERATURE_GPU,)), 1, SWEEP,
      "gpu_temperature_celsius", "GPU core temperature.", trace=True),
    V("memory_temperature_celsius", Field(fi.MEMORY_TEMP), 1, SWEEP,
      "gpu_memory_temperature_celsius", "HBM temperature.", trace=True),
    V("sm_clock_hertz", Call("nvmlDeviceGetClockInfo", (CLOCK_SM,)), 1e6, SWEEP,
      "gpu_sm_clock_hertz", "Current SM clock.", trace=True),
    # The memory clock moves with P-states, not steps, and the video engines are not what a
    # training node is watched for: neither is worth its calls every second (HEALTH).
    V("memory_clock_hertz", Call("nvmlDeviceGetClockInfo", (CLOCK_MEM,)), 1e6, HEALTH,
      "gpu_memory_clock_hertz", "Current memory clock.", trace=True),
    V("fan_speed_ratio", Call("nvmlDeviceGetFanSpeed"), 0.01, SWEEP, "gpu_fan_speed_ratio",
      "Fan speed as a share of its maximum (0-1)."),
    V("clock_event_reasons", Call("nvmlDeviceGetCurrentClocksEventReasons"), 1, SWEEP, None,
      trace=True),
    V("memory_free_bytes", Call("nvmlDeviceGetMemoryInfo", (MEMORY_INFO_V2,), "free"), 1,
      SWEEP, "gpu_memory_free_bytes", "Device memory neither used nor reserved."),
    V("memory_reserved_bytes", Call("nvmlDeviceGetMemoryInfo", (MEMORY_INFO_V2,), "reserved"),
      1, SWEEP, "gpu_memory_reserved_bytes",
      "Device memory reserved by the driver and firmware (not available to applications)."),
    V("encoder_utilization_ratio", Call("nvmlDeviceGetEncoderUtilization", member=0), 0.01,
      HEALTH, "gpu_encoder_utilization_ratio",
      "Share of the driver's sample period the video encoders (NVENC) were busy (0-1)."),
    V("decoder_utilization_ratio", Call("nvmlDeviceGetDecoderUtilization", member=0), 0.01,
      HEALTH, "gpu_decoder_utilization_ratio",
      "Share of the driver's sample period the video decoders (NVDEC) were busy (0-1)."),
    # The driver's own counters of time the clocks were held down, by reason (ns): exact,
    # where gpu_clock_event_seconds_total samples the reason bits once a sweep. 74 and 269
    # cost 3 us; 75, 270 and 271 0.4-0.7 ms each, so those (counters: freshness is all a
    # slower read loses) are read with the energy counter, every energy interval.
    *(V(f"clock_event_{reason}_seconds", Field(field), 1e-9, cadence, CLOCK_EVENT_DRIVER,
        CLOCK_EVENT_DRIVER_HELP, "counter", label=("reason", reason))
      for reason, field, cadence in (
          ("sw_power_cap", fi.VIOLATION_POWER, SWEEP),
          ("sw_thermal_slowdown", fi.VIOLATION_SW_THERMAL, SWEEP),
          ("thermal", fi.VIOLATION_THERMAL, ENERGY),
          ("hw_thermal_slowdown", fi.VIOLATION_HW_THERMAL, ENERGY),
          ("hw_power_brake_slowdown", fi.VIOLATION_HW_POWER_BRAKE, ENERGY))),
    # every health interval
    V("power_limit_watts", Call("nvmlDeviceGetEnforcedPowerLimit"), 1e-3, HEALTH,
      "gpu_power_limit_watts", "Enforced power limit.", trace=True),
    V("performance_state", Call("nvmlDeviceGetPerformanceState"), 1, HEALTH,
      "gpu_performance_state", "Performance state (0 = P0, fastest; 15 = P15)."),
    V("pcie_transmit_bytes", Field(fi.PCIE_TX_BYTES), 1, HEALTH, "gpu_pcie_transmit_bytes",
      "Bytes the GPU sent over PCIe.", "counter"),
    V("pcie_receive_bytes", Field(fi.PCIE_RX_BYTES), 1, HEALTH, "gpu_pcie_receive_bytes",
      "Bytes the GPU received over PCIe.", "counter"),
    V("pcie_replays", Field(fi.PCIE_REPLAY_COUNTER), 1, HEALTH, "gpu_pcie_replays",
      "PCIe replays (link-level retransmissions).", "counter"),
    V("pcie_generation", Call("nvmlDeviceGetCurrPcieLinkGeneration"), 1, HEALTH,
      "gpu_pcie_link_generation", "Current PCIe link generation."),
    V("pcie_width", Call("nvmlDeviceGetCurrPcieLinkWidth"), 1, HEALTH,
      "gpu_pcie_link_width", "Current PCIe link width (lanes)."),
    # every energy interval
    V("energy_joules", Field(fi.TOTAL_ENERGY), 1e-3, ENERGY, "gpu_energy_joules",
      "Energy used since the driver was loaded (the driver's counter, read every "
      "--energy.interval).", "counter", trace=True),
)

BY_KEY = {value.key: value for value in CATALOGUE}
BY_FIELD = {value.nvml.id: value for value in CATALOGUE if isinstance(value.nvml, Field)}
TRACE_KEYS = tuple(value.key for value in CATALOGUE if value.trace)


def families() -> dict[str, tuple[GpuValue, ...]]:
    """Metric name -> the entries whose series it holds (several where `label` is set),
    in catalogue order."""
    out: dict[str, list[GpuValue]] = {}
    for value in CATALOGUE:
        if value.metric is not None:
            out.setdefault(value.metric, []).append(value)
    return {name: tuple(values) for name, values in out.items()}


FAMILIES = families()


@functools.lru_cache(maxsize=32)
def of_cadence(*cadences: str) -> tuple[GpuValue, ...]:
    return tuple(value for value in CATALOGUE if value.cadence in cadences)
