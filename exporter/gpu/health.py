"""GPU health read every few sweeps: ECC, retired pages, row remapping, recovery action
and NVLink, in as few NVML calls as possible.

Everything field-based goes into one batched nvmlDeviceGetFieldValues request per GPU
(NVLink counters with the link as scope id), so 18 links cost one call, not 90.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pynvml

from exporter.gpu.backend import NvmlBackend

FI_RETIRED_SBE, FI_RETIRED_DBE, FI_RETIRED_PENDING = 29, 30, 31
FI_REMAPPED = {"correctable": 142, "uncorrectable": 143}
FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE = 144, 145
FI_RECOVERY_ACTION = 230
FI_ECC = {  # (type, counter) -> field
    ("corrected", "volatile"): pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
    ("uncorrected", "volatile"): pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    ("corrected", "aggregate"): pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
    ("uncorrected", "aggregate"): pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
}
FI_NVLINK_STATE = 165
FI_NVLINK_ERRORS = {"replay": 161, "recovery": 162, "crc_flit": 163}
FI_NVLINK_TX, FI_NVLINK_RX = 138, 139  # KiB
# Data-CRC counters exist only as one field per link for links 0-11; later links are
# read with nvmlDeviceGetNvLinkErrorCounter.
FI_NVLINK_CRC_DATA = (39, 40, 41, 42, 43, 44, 102, 103, 104, 105, 106, 107)

RECOVERY_ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p",
                    4: "drain_and_reset", 5: "recover_imex_domain", 6: "bus_reset",
                    7: "system_reboot"}

CLOCK_EVENT_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


@dataclass(frozen=True)
class NvLink:
    link: int
    up: bool | None
    transmit_bytes: float | None = None
    receive_bytes: float | None = None
    errors: dict[str, float] = field(default_factory=dict)  # replay, recovery, crc_flit, ...


@dataclass(frozen=True)
class GpuHealth:
    time: float
    ecc_errors: dict[tuple[str, str], float]  # (corrected|uncorrected, volatile|aggregate)
    retired_pages: dict[str, float]  # single_bit / double_bit
    retired_pages_pending: float | None
    remapped_rows: dict[str, float]  # correctable / uncorrectable
    row_remap_pending: float | None
    row_remap_failure: float | None
    recovery_action: str | None
    nvlinks: tuple[NvLink, ...]


def health_requests(nvlinks: int) -> list[int | tuple[int, int]]:
    """The field requests of one health read, for a GPU with `nvlinks` links."""
    requests: list[int | tuple[int, int]] = [
        *FI_ECC.values(), FI_RETIRED_SBE, FI_RETIRED_DBE, FI_RETIRED_PENDING,
        *FI_REMAPPED.values(), FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE, FI_RECOVERY_ACTION]
    for link in range(nvlinks):
        requests += [(FI_NVLINK_STATE, link), (FI_NVLINK_TX, link), (FI_NVLINK_RX, link)]
        requests += [(fid, link) for fid in FI_NVLINK_ERRORS.values()]
    requests += [(fid, 0) for fid in FI_NVLINK_CRC_DATA[:nvlinks]]
    return requests


def read_health(backend: NvmlBackend, gpu: int, nvlinks: int, now: float) -> GpuHealth | None:
    handle = backend.handle(gpu)
    if handle is None:
        return None
    got = backend.scoped_fields(gpu, health_requests(nvlinks))

    def value(fid: int, scope: int = 0) -> float | None:
        reading = got.get((fid, scope))
        return None if reading is None else reading.value

    links = []
    for link in range(nvlinks):
        state = value(FI_NVLINK_STATE, link)
        errors = {name: v for name, fid in FI_NVLINK_ERRORS.items()
                  if (v := value(fid, link)) is not None}
        if link < len(FI_NVLINK_CRC_DATA):
            crc_data = value(FI_NVLINK_CRC_DATA[link])
        else:
            crc_data = backend.call("nvmlDeviceGetNvLinkErrorCounter",
                                    handle, link,
                                    pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA, gpu=gpu)
        if crc_data is not None:
            errors["crc_data"] = float(crc_data)
        tx, rx = value(FI_NVLINK_TX, link), value(FI_NVLINK_RX, link)
        links.append(NvLink(link, None if state is None else bool(state),
                            None if tx is None else tx * 1024,
                            None if rx is None else rx * 1024, errors))
    action = value(FI_RECOVERY_ACTION)
    return GpuHealth(
        time=now,
        ecc_errors={key: v for key, fid in FI_ECC.items() if (v := value(fid)) is not None},
        retired_pages={name: v for name, fid in (("single_bit", FI_RETIRED_SBE),
                                                 ("double_bit", FI_RETIRED_DBE))
                       if (v := value(fid)) is not None},
        retired_pages_pending=value(FI_RETIRED_PENDING),
        remapped_rows={name: v for name, fid in FI_REMAPPED.items()
                       if (v := value(fid)) is not None},
        row_remap_pending=value(FI_REMAPPED_PENDING),
        row_remap_failure=value(FI_REMAPPED_FAILURE),
        recovery_action=None if action is None else RECOVERY_ACTIONS.get(int(action),
                                                                          f"code_{int(action)}"),
        nvlinks=tuple(links),
    )
