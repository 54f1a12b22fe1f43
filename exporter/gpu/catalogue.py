"""The catalogue of per-GPU values: what to read, how often, and the family it is served in.

One entry per value: where NVML has it (a field id, or a call and the struct member of
its answer), the factor to base units, how often it is read, the family it is one series
of (a `Family` declared here, with its labels' values where entries share one), and
whether traces carry it. The sweep reads from here, the renderer writes the families from
here, `record` and replay take their columns from here, and the fake answers each field
and call with its model's value divided by the same factor (the memory errors: from the
scenario's faults). A new per-GPU metric is one entry.

Where a per-GPU value lives:
- A number NVML answers for the GPU (a field, or a member of a call's answer), read on
  one of the cadences below, one series per GPU and fixed label values: an entry here.
- A field NVML answers per NVLink (the link as its scope id): an entry of PER_LINK,
  which the device read asks for every link in its one batched request (gpu/device_read.py);
  metrics/gpu_hardware.py renders them from that reading.
- Written by hand beside its code, with a comment saying why, when it is none of that:
  identity (`gpu_info`, strings; metrics/gpu.py), the power loop's samples
  (`gpu_power_watts`; gpu/power_reader.py), events (XIDs), the sampler's own judgement
  (up, lost, clock-event seconds integrated sweep to sweep), a value served as a label
  (the recovery action, the clock-event reason bits), NVLink data CRC errors (a field
  per link for links 0-11, nvmlDeviceGetNvLinkErrorCounter for 12+) and the all-links
  traffic total. GPM ratios are the profiling collector's (gpu/gpm.py,
  collectors/profiling): differences of two samples, not a value read.

Cadence, chosen by what each read costs on a real H200 (exporter/sim/costs.py):
- once: at start and when a lost GPU comes back (static: limits, maximum clocks);
- sweep: every sweep (default 1 s): the cheap getters, 1-8 us each;
- slow: the slow sweep, every --sweep.health-interval (default 15 s): slowly changing
  values, the PCIe counters (80-170 us per field) and the memory errors;
- energy: every energy interval (default 30 s): the energy counter, ~4 ms of CPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from exporter.families import FULL, MINIMAL, STANDARD, Family
from exporter.gpu import fields as fi

ONCE, SWEEP, SLOW, ENERGY = "once", "sweep", "slow", "energy"
CADENCES = (ONCE, SWEEP, SLOW, ENERGY)

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


GPU = ("gpu", "uuid")  # the labels every per-GPU family begins with


def per_gpu(name: str, type_: str, help_: str, *labels: str, unit: str = "-", source: str,
            profile: str = STANDARD, doc: str = "") -> Family:
    """A per-GPU family's declaration: labels `gpu`, `uuid`, then `labels`."""
    return Family(name, type_, help_, (*GPU, *labels), unit, source, profile, doc)


@dataclass(frozen=True)
class GpuValue:
    key: str  # base-unit name: the state's key and the trace column
    nvml: Field | Call  # the NVML field or call that reads it
    scale: float  # NVML's unit -> base unit
    cadence: str
    family: Family | None  # the family it is served in; None: rendered elsewhere
    trace: bool = False  # recorded by `record`, replayed by `run --replay`
    # the values of the family's labels after gpu and uuid (and link) (one series of a
    # family that several entries share)
    labels: tuple[str, ...] = ()
    per_link: bool = False  # one series per NVLink (label `link`): read for each link

    def __post_init__(self) -> None:
        wanted = () if self.family is None else self.family.labels[len(GPU):]
        if self.per_link:
            if wanted[:1] != ("link",):
                raise ValueError(f"{self.key}: a per-link family's labels go on with link")
            wanted = wanted[1:]
        if self.family is not None and self.family.labels[:len(GPU)] != GPU:
            raise ValueError(f"{self.key}: a per-GPU family's labels begin with {GPU}")
        if len(self.labels) != len(wanted):
            raise ValueError(f"{self.key}: label values {self.labels} for {wanted}")


CLOCK_EVENT_DRIVER = per_gpu(
    "gpu_clock_event_driver_seconds_total", "counter",
    "Time the driver counted the clocks held down for a reason (its own violation "
    "counters; `thermal`: any thermal capping).", "reason", unit="s", profile=FULL,
    source="fields `NVML_FI_DEV_PERF_POLICY_POWER` (74, `sw_power_cap`), "
           "`CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN` (269, `sw_thermal_slowdown`) every "
           "sweep; `PERF_POLICY_THERMAL` (75, `thermal`), `..._HW_THERM_SLOWDOWN` (270, "
           "`hw_thermal_slowdown`), `..._HW_POWER_BRAKE_SLOWDOWN` (271, "
           "`hw_power_brake_slowdown`) every energy interval (30 s); ns",
    doc="The driver's own counters of time the clocks were held down, by reason: exact, "
        "where `gpu_clock_event_seconds_total` samples the reason bits once a sweep and "
        "misses short episodes. `thermal` is any thermal capping (DCGM's "
        "`DCGM_FI_DEV_THERMAL_VIOLATION`; `sw_power_cap` is `DCGM_FI_DEV_POWER_VIOLATION`). "
        "Fields 75, 270 and 271 cost 0.4-0.7 ms each on an H200, hence the slower cadence. "
        "A reason the driver does not count is absent.")

# The memory errors the driver counts: read in the slow sweep; the health checks
# take them from the device read (gpu/device_read.py), which gathers them from these entries.
ECC = per_gpu(
    "gpu_ecc_errors_total", "counter", "ECC errors: corrected (single-bit) or uncorrected "
    "(double-bit); volatile since the last driver load, aggregate over the GPU's life.",
    "type", "scope", source="fields 3-6 (`ECC_SBE/DBE_VOL/AGG_TOTAL`)", profile=MINIMAL,
    doc="ECC errors: `type` corrected (single-bit) or uncorrected (double-bit); `scope` "
        "volatile (since driver load) or aggregate (lifetime).")
RETIRED = per_gpu(
    "gpu_retired_pages_total", "counter",
    "Pages retired, by cause (single_bit, double_bit).", "cause", source="fields 29, 30",
    doc="Pages retired for `single_bit` or `double_bit` errors (pre-Hopper; DCGM's "
        "threshold is 63).")
RETIRED_PENDING = per_gpu(
    "gpu_retired_pages_pending", "gauge", "1 if a page waits for retirement (next reset).",
    source="field 31", doc="1 if a page waits for retirement at the next reset.")
REMAPPED = per_gpu(
    "gpu_remapped_rows_total", "counter", "HBM rows remapped, by the error that caused it "
    "(correctable, uncorrectable).", "type", source="fields 142, 143", profile=MINIMAL,
    doc="HBM rows remapped after `correctable` or `uncorrectable` errors.")
REMAP_PENDING = per_gpu(
    "gpu_row_remap_pending", "gauge", "1 if a row remap waits for the next GPU reset.",
    source="field 144", profile=MINIMAL,
    doc="1 if a remap waits for the next GPU reset (warning).")
REMAP_FAILURE = per_gpu(
    "gpu_row_remap_failure", "gauge",
    "1 if a row remap failed: the GPU needs replacing (RMA).", source="field 145",
    profile=MINIMAL, doc="1 if a remap failed: replace the GPU (critical).")
MEMORY_ERRORS = (ECC, RETIRED, RETIRED_PENDING, REMAPPED, REMAP_PENDING, REMAP_FAILURE)

# Per-NVLink families (exporter/metrics/gpu_hardware.py renders them from the device read)
LINK_UP = per_gpu(
    "gpu_nvlink_link_up", "gauge", "1 if the NVLink is active.", "link",
    source="field 165 (`NVLINK_GET_STATE`), scope = link", profile=FULL,
    doc="1 if the link is active.")
NVLINK_TX = per_gpu(
    "gpu_nvlink_transmit_bytes_total", "counter", "Data bytes sent over the NVLink.",
    "link", unit="bytes", source="field 138 (KiB), scope = link", doc="Data bytes sent.")
NVLINK_RX = per_gpu(
    "gpu_nvlink_receive_bytes_total", "counter", "Data bytes received over the NVLink.",
    "link", unit="bytes", source="field 139 (KiB), scope = link",
    doc="Data bytes received.")
NVLINK_ERRORS = per_gpu(
    "gpu_nvlink_errors_total", "counter", "NVLink data-link errors by type: replay, "
    "recovery, crc_flit, crc_data.", "link", "type", profile=MINIMAL,
    source="fields 161-163 (scope = link); data CRC: fields 39-44/102-107 (links 0-11), "
           "`nvmlDeviceGetNvLinkErrorCounter` (links 12+)",
    doc="Data-link errors: `replay`, `recovery`, `crc_flit`, `crc_data`.")

V = GpuValue
CATALOGUE: tuple[GpuValue, ...] = (
    # static
    V("default_power_limit_watts", Call("nvmlDeviceGetPowerManagementDefaultLimit"), 1e-3,
      ONCE, per_gpu("gpu_power_default_limit_watts", "gauge",
                    "Default power limit (the board's TDP).", unit="W",
                    source="`nvmlDeviceGetPowerManagementDefaultLimit`",
                    doc="Default power limit: the board's TDP.")),
    V("power_max_limit_watts", Field(188), 1e-3, ONCE,  # NVML_FI_DEV_POWER_MAX_LIMIT, mW
      per_gpu("gpu_power_max_limit_watts", "gauge",
              "Highest power limit the board accepts.", unit="W",
              source="field `NVML_FI_DEV_POWER_MAX_LIMIT` (188), mW", profile=FULL,
              doc="Highest power limit the board accepts (the most `nvidia-smi -pl` can "
                  "set): the top of the range a power cap moves in.")),
    V("pcie_max_generation", Call("nvmlDeviceGetMaxPcieLinkGeneration"), 1, ONCE,
      per_gpu("gpu_pcie_link_max_generation", "gauge",
              "Maximum PCIe link generation of the GPU and slot.",
              source="`nvmlDeviceGetMaxPcieLinkGeneration`",
              doc="Highest PCIe generation the GPU and slot support.")),
    V("pcie_max_width", Call("nvmlDeviceGetMaxPcieLinkWidth"), 1, ONCE,
      per_gpu("gpu_pcie_link_max_width", "gauge", "Maximum PCIe link width (lanes).",
              unit="lanes", source="`nvmlDeviceGetMaxPcieLinkWidth`",
              doc="Widest PCIe link the GPU and slot support.")),
    V("sm_clock_max_hertz", Call("nvmlDeviceGetMaxClockInfo", (CLOCK_SM,)), 1e6, ONCE,
      per_gpu("gpu_sm_clock_max_hertz", "gauge", "Maximum SM clock.", unit="Hz",
              source="`nvmlDeviceGetMaxClockInfo(SM)`")),
    # every sweep
    V("utilization_gpu_ratio", Call("nvmlDeviceGetUtilizationRates", member="gpu"), 0.01,
      SWEEP, per_gpu("gpu_utilization_ratio", "gauge",
                     "Share of time a kernel was running (0-1).", unit="ratio",
                     source="`nvmlDeviceGetUtilizationRates().gpu`", profile=MINIMAL,
                     doc="Share of the last sample period a kernel was running (0-1). "
                         "Busy-waiting in NCCL counts as busy."), trace=True),
    V("utilization_memory_ratio", Call("nvmlDeviceGetUtilizationRates", member="memory"),
      0.01, SWEEP, per_gpu("gpu_memory_utilization_ratio", "gauge",
                           "Share of time device memory was read or written (0-1).",
                           unit="ratio", source="`nvmlDeviceGetUtilizationRates().memory`",
                           doc="Share of the period device memory was read or written "
                               "(0-1)."), trace=True),
    V("memory_used_bytes", Call("nvmlDeviceGetMemoryInfo", member="used"), 1, SWEEP,
      per_gpu("gpu_memory_used_bytes", "gauge", "Device memory in use.", unit="bytes",
              source="`nvmlDeviceGetMemoryInfo().used` (version 1's used, reserved memory "
                     "included: total - free of `nvmlDeviceGetMemoryInfo_v2` where the "
                     "driver has it)", profile=MINIMAL), trace=True),
    V("memory_total_bytes", Call("nvmlDeviceGetMemoryInfo", member="total"), 1, SWEEP,
      per_gpu("gpu_memory_total_bytes", "gauge", "Device memory in total.", unit="bytes",
              source="`nvmlDeviceGetMemoryInfo().total` (of `_v2` where the driver has it)",
              profile=MINIMAL)),
    V("power_average_watts", Field(fi.POWER_AVERAGE), 1e-3, SWEEP,
      per_gpu("gpu_power_average_watts", "gauge",
              "Power averaged by the driver over about 1 s.", unit="W",
              source="field `NVML_FI_DEV_POWER_AVERAGE` (185)",
              doc="The driver's ~1 s power average (what `nvmlDeviceGetPowerUsage` "
                  "returns on Ampere and newer)."), trace=True),
    V("temperature_celsius", Call("nvmlDeviceGetTemperature", (TEMPERATURE_GPU,)), 1, SWEEP,
      per_gpu("gpu_temperature_celsius", "gauge", "GPU core temperature.", unit="°C",
              source="`nvmlDeviceGetTemperature(GPU)`", profile=MINIMAL,
              doc="Core temperature."), trace=True),
    V("memory_temperature_celsius", Field(fi.MEMORY_TEMP), 1, SWEEP,
      per_gpu("gpu_memory_temperature_celsius", "gauge", "HBM temperature.", unit="°C",
              source="field `NVML_FI_DEV_MEMORY_TEMP` (82)",
              doc="HBM temperature, where supported."), trace=True),
    V("sm_clock_hertz", Call("nvmlDeviceGetClockInfo", (CLOCK_SM,)), 1e6, SWEEP,
      per_gpu("gpu_sm_clock_hertz", "gauge", "Current SM clock.", unit="Hz",
              source="`nvmlDeviceGetClockInfo(SM)`"), trace=True),
    # The memory clock moves with P-states, not steps, and the video engines are not what a
    # training node is watched for: neither is worth its calls every second (SLOW).
    V("memory_clock_hertz", Call("nvmlDeviceGetClockInfo", (CLOCK_MEM,)), 1e6, SLOW,
      per_gpu("gpu_memory_clock_hertz", "gauge", "Current memory clock.", unit="Hz",
              source="`nvmlDeviceGetClockInfo(MEM)`"), trace=True),
    V("fan_speed_ratio", Call("nvmlDeviceGetFanSpeed"), 0.01, SWEEP,
      per_gpu("gpu_fan_speed_ratio", "gauge", "Fan speed as a share of its maximum (0-1).",
              unit="ratio", source="`nvmlDeviceGetFanSpeed`",
              doc="Fan speed as a share of maximum; absent on fanless (SXM) boards.")),
    # hand-written: one bit mask that gpu_clock_event_active splits into a series per
    # reason and the sampler integrates into gpu_clock_event_seconds_total
    # (exporter/metrics/gpu_hardware.py)
    V("clock_event_reasons", Call("nvmlDeviceGetCurrentClocksEventReasons"), 1, SWEEP, None,
      trace=True),
    V("memory_free_bytes", Call("nvmlDeviceGetMemoryInfo", (MEMORY_INFO_V2,), "free"), 1,
      SWEEP, per_gpu("gpu_memory_free_bytes", "gauge",
                     "Device memory neither used nor reserved.", unit="bytes",
                     source="`nvmlDeviceGetMemoryInfo_v2().free`",
                     doc="Device memory neither used nor reserved: what an allocation can "
                         "still get.")),
    V("memory_reserved_bytes", Call("nvmlDeviceGetMemoryInfo", (MEMORY_INFO_V2,), "reserved"),
      1, SWEEP, per_gpu(
          "gpu_memory_reserved_bytes", "gauge",
          "Device memory reserved by the driver and firmware (not available to "
          "applications).", unit="bytes", source="`nvmlDeviceGetMemoryInfo_v2().reserved`",
          profile=FULL,
          doc="Device memory the driver and firmware reserve (counted in "
              "`gpu_memory_used_bytes`, which comes from version 1 of the call; never "
              "available to applications).")),
    V("encoder_utilization_ratio", Call("nvmlDeviceGetEncoderUtilization", member=0), 0.01,
      SLOW, per_gpu(
          "gpu_encoder_utilization_ratio", "gauge",
          "Share of the driver's sample period the video encoders (NVENC) were busy (0-1).",
          unit="ratio", source="`nvmlDeviceGetEncoderUtilization`", profile=FULL,
          doc="Share of the driver's sample period the video encoders (NVENC) were busy "
              "(0-1); absent where the GPU has none (H100).")),
    V("decoder_utilization_ratio", Call("nvmlDeviceGetDecoderUtilization", member=0), 0.01,
      SLOW, per_gpu(
          "gpu_decoder_utilization_ratio", "gauge",
          "Share of the driver's sample period the video decoders (NVDEC) were busy (0-1).",
          unit="ratio", source="`nvmlDeviceGetDecoderUtilization`", profile=FULL)),
    # The driver's own counters of time the clocks were held down, by reason (ns): exact,
    # where gpu_clock_event_seconds_total samples the reason bits once a sweep. 74 and 269
    # cost 3 us; 75, 270 and 271 0.4-0.7 ms each, so those (counters: freshness is all a
    # slower read loses) are read with the energy counter, every energy interval.
    *(V(f"clock_event_{reason}_seconds", Field(field), 1e-9, cadence, CLOCK_EVENT_DRIVER,
        labels=(reason,))
      for reason, field, cadence in (
          ("sw_power_cap", fi.VIOLATION_POWER, SWEEP),
          ("sw_thermal_slowdown", fi.VIOLATION_SW_THERMAL, SWEEP),
          ("thermal", fi.VIOLATION_THERMAL, ENERGY),
          ("hw_thermal_slowdown", fi.VIOLATION_HW_THERMAL, ENERGY),
          ("hw_power_brake_slowdown", fi.VIOLATION_HW_POWER_BRAKE, ENERGY))),
    # the slow sweep
    V("power_limit_watts", Call("nvmlDeviceGetEnforcedPowerLimit"), 1e-3, SLOW,
      per_gpu("gpu_power_limit_watts", "gauge", "Enforced power limit.", unit="W",
              source="`nvmlDeviceGetEnforcedPowerLimit`", profile=MINIMAL,
              doc="Power limit in force now."), trace=True),
    V("performance_state", Call("nvmlDeviceGetPerformanceState"), 1, SLOW,
      per_gpu("gpu_performance_state", "gauge",
              "Performance state (0 = P0, fastest; 15 = P15).",
              source="`nvmlDeviceGetPerformanceState`",
              doc="P-state: 0 is fastest, 15 slowest.")),
    V("pcie_transmit_bytes", Field(fi.PCIE_TX_BYTES), 1, SLOW,
      per_gpu("gpu_pcie_transmit_bytes_total", "counter", "Bytes the GPU sent over PCIe.",
              unit="bytes", source="field `NVML_FI_DEV_PCIE_COUNT_TX_BYTES` (197)",
              doc="Bytes sent over PCIe (a counter: no 20 ms sampling as "
                  "`nvmlDeviceGetPcieThroughput` would need).")),
    V("pcie_receive_bytes", Field(fi.PCIE_RX_BYTES), 1, SLOW,
      per_gpu("gpu_pcie_receive_bytes_total", "counter", "Bytes the GPU received over PCIe.",
              unit="bytes", source="field `NVML_FI_DEV_PCIE_COUNT_RX_BYTES` (198)",
              doc="Bytes received over PCIe.")),
    V("pcie_replays", Field(fi.PCIE_REPLAY_COUNTER), 1, SLOW,
      per_gpu("gpu_pcie_replays_total", "counter",
              "PCIe replays (link-level retransmissions).",
              source="field `NVML_FI_DEV_PCIE_REPLAY_COUNTER` (94)", profile=MINIMAL,
              doc="PCIe link-level replays; DCGM 4.x warns above ceil(per-lane rate x "
                  "lanes) a minute (Gen4 x16: 16, Gen5 x16: 31; `GpuPcieReplaysHigh`).")),
    V("pcie_generation", Call("nvmlDeviceGetCurrPcieLinkGeneration"), 1, SLOW,
      per_gpu("gpu_pcie_link_generation", "gauge", "Current PCIe link generation.",
              source="`nvmlDeviceGetCurrPcieLinkGeneration`",
              doc="Current PCIe generation; below the max while idle is normal power "
                  "saving, under load it means a degraded link.")),
    V("pcie_width", Call("nvmlDeviceGetCurrPcieLinkWidth"), 1, SLOW,
      per_gpu("gpu_pcie_link_width", "gauge", "Current PCIe link width (lanes).",
              unit="lanes", source="`nvmlDeviceGetCurrPcieLinkWidth`",
              doc="Current PCIe link width.")),
    *(V(f"ecc_{kind}_{scope}", Field(field), 1, SLOW, ECC, labels=(kind, scope))
      for kind, scope, field in (
          ("corrected", "volatile", fi.ECC_SBE_VOL_TOTAL),
          ("uncorrected", "volatile", fi.ECC_DBE_VOL_TOTAL),
          ("corrected", "aggregate", fi.ECC_SBE_AGG_TOTAL),
          ("uncorrected", "aggregate", fi.ECC_DBE_AGG_TOTAL))),
    V("retired_pages_single_bit", Field(fi.RETIRED_SBE), 1, SLOW, RETIRED,
      labels=("single_bit",)),
    V("retired_pages_double_bit", Field(fi.RETIRED_DBE), 1, SLOW, RETIRED,
      labels=("double_bit",)),
    V("retired_pages_pending", Field(fi.RETIRED_PENDING), 1, SLOW, RETIRED_PENDING),
    V("remapped_rows_correctable", Field(fi.REMAPPED_COR), 1, SLOW, REMAPPED,
      labels=("correctable",)),
    V("remapped_rows_uncorrectable", Field(fi.REMAPPED_UNC), 1, SLOW, REMAPPED,
      labels=("uncorrectable",)),
    V("row_remap_pending", Field(fi.REMAPPED_PENDING), 1, SLOW, REMAP_PENDING),
    V("row_remap_failure", Field(fi.REMAPPED_FAILURE), 1, SLOW, REMAP_FAILURE),
    # every energy interval
    V("energy_joules", Field(fi.TOTAL_ENERGY), 1e-3, ENERGY, per_gpu(
        "gpu_energy_joules_total", "counter",
        "Energy used since the driver was loaded (the driver's counter, read every "
        "--energy.interval).", unit="J",
        source="field `NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION` (83), mJ", profile=MINIMAL,
        doc="Energy since the driver was loaded, read every `--energy.interval` (30 s); "
            "`rate()` over a few minutes of it is exact average power. For a value fresh "
            "at every snapshot, see `gpu_power_sampled_energy_joules_total`."),
      trace=True),
)

BY_KEY = {value.key: value for value in CATALOGUE}
BY_FIELD = {value.nvml.id: value for value in CATALOGUE if isinstance(value.nvml, Field)}
TRACE_KEYS = tuple(value.key for value in CATALOGUE if value.trace)


def families() -> dict[Family, tuple[GpuValue, ...]]:
    """Each family -> the entries whose series it holds (several where they carry label
    values), in catalogue order."""
    out: dict[Family, list[GpuValue]] = {}
    for value in CATALOGUE:
        if value.family is not None:
            out.setdefault(value.family, []).append(value)
    return {family: tuple(values) for family, values in out.items()}


FAMILIES = families()
DECLARED = tuple(FAMILIES)  # the catalogue's families, in catalogue order


@functools.lru_cache(maxsize=32)
def of_cadence(*cadences: str) -> tuple[GpuValue, ...]:
    return tuple(value for value in CATALOGUE if value.cadence in cadences)


# Per-NVLink values: the device read (gpu/device_read.py) asks each for every link, the link as
# the field's scope id, in its one batched request per GPU, and only those a served family
# needs (a profile that sums `link` away gets the traffic as the driver's all-links total,
# scope 0xFFFFFFFF). Not in CATALOGUE: the sweep does not read them. Data CRC errors are
# read by hand there: one field per link for links 0-11, a call for links 12+.
PER_LINK: tuple[GpuValue, ...] = (
    V("nvlink_up", Field(fi.NVLINK_STATE), 1, SLOW, LINK_UP, per_link=True),
    V("nvlink_transmit_bytes", Field(fi.NVLINK_TX), 1024, SLOW, NVLINK_TX, per_link=True),
    V("nvlink_receive_bytes", Field(fi.NVLINK_RX), 1024, SLOW, NVLINK_RX, per_link=True),
    *(V(f"nvlink_{kind}_errors", Field(field), 1, SLOW, NVLINK_ERRORS, labels=(kind,),
        per_link=True)
      for kind, field in (("replay", fi.NVLINK_REPLAY), ("recovery", fi.NVLINK_RECOVERY),
                          ("crc_flit", fi.NVLINK_CRC_FLIT))),
)


def per_link(family: Family) -> tuple[GpuValue, ...]:
    """The per-NVLink entries of a family."""
    return tuple(e for e in PER_LINK if e.family is family)
