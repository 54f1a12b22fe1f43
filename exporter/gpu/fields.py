"""NVML's numbers, in one place: field ids, clock-event reason bits, recovery actions.

Plain ints (nvml.h / nvidia-ml-py), so that the catalogue, the renderer and the fake can
use them without importing pynvml. Costs of reading them on a real H200 are in
exporter/sim/costs.py (docs/nvml-costs.md).
"""

from __future__ import annotations

# -- field ids (nvmlDeviceGetFieldValues) ----------------------------------------------
ECC_CURRENT = 1
ECC_SBE_VOL_TOTAL, ECC_DBE_VOL_TOTAL = 3, 4
ECC_SBE_AGG_TOTAL, ECC_DBE_AGG_TOTAL = 5, 6
RETIRED_SBE, RETIRED_DBE, RETIRED_PENDING = 29, 30, 31
# NVLink data-CRC counters exist only as one field per link, for links 0-11.
NVLINK_CRC_DATA = (39, 40, 41, 42, 43, 44, 102, 103, 104, 105, 106, 107)
VIOLATION_POWER = 74  # ns of SW power capping (PERF_POLICY_POWER)
VIOLATION_THERMAL = 75  # ns of thermal capping (PERF_POLICY_THERMAL)
MEMORY_TEMP = 82
TOTAL_ENERGY = 83  # mJ since driver load; ~4 ms of CPU on Hopper: read seldom
NVLINK_LINK_COUNT = 91
PCIE_REPLAY_COUNTER = 94
NVLINK_TX, NVLINK_RX = 138, 139  # KiB, per link (scope id)
REMAPPED_COR, REMAPPED_UNC, REMAPPED_PENDING, REMAPPED_FAILURE = 142, 143, 144, 145
NVLINK_REPLAY, NVLINK_RECOVERY, NVLINK_CRC_FLIT = 161, 162, 163  # per link
NVLINK_STATE = 165  # per link
POWER_AVERAGE = 185  # mW, the driver's ~1 s average
POWER_INSTANT = 186  # mW; changes every ~100 ms on an H200
POWER_CURRENT_LIMIT = 190
PCIE_TX_BYTES, PCIE_RX_BYTES = 197, 198
RECOVERY_ACTION = 230
VIOLATION_SW_THERMAL, VIOLATION_HW_THERMAL, VIOLATION_HW_POWER_BRAKE = 269, 270, 271

# For error labels, nvmlDeviceGetFieldValues(NAME): a field is named by nvidia-ml-py's
# NVML_FI_DEV_* constant (gpu/backend.py's field_name); NAMES holds only the fields whose
# label has always been another name than nvidia-ml-py's, so that no label value changes.
NAMES = {
    **{fid: f"NVLINK_CRC_DATA_L{i}" for i, fid in enumerate(NVLINK_CRC_DATA)},
    NVLINK_REPLAY: "NVLINK_REPLAY_ERRORS", NVLINK_RECOVERY: "NVLINK_RECOVERY_ERRORS",
    NVLINK_CRC_FLIT: "NVLINK_CRC_ERRORS",
    VIOLATION_SW_THERMAL: "CLOCKS_EVENT_REASON_SW_THERMAL_SLOWDOWN",
    VIOLATION_HW_THERMAL: "CLOCKS_EVENT_REASON_HW_THERMAL_SLOWDOWN",
}


# -- clock-event (throttle) reasons: nvmlClocksEventReason* bits --------------------------
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

# -- recovery action (field 230) -------------------------------------------------------------
# The driver's own tokens, served only on gpu_recovery_action; the actions a person is told
# (reset_gpu, reboot_node, ...) are the verdict's, exporter/health/model.py's ACTIONS.
DRIVER_RECOVERY_TOKENS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p",
                          4: "drain_and_reset", 5: "recover_imex_domain", 6: "bus_reset",
                          7: "system_reboot"}

# -- nvmlDeviceGetNvLinkErrorCounter counters --------------------------------------------------
NVLINK_ERROR_DL_CRC_DATA = 3

# -- nvmlDeviceGetSamples sampling types -------------------------------------------------------
TOTAL_POWER_SAMPLES = 0
GPU_UTILIZATION_SAMPLES = 1
