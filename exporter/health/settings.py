"""The health checks' thresholds: each declared once, NVIDIA's value as its default, and
where that value comes from in the help (docs/health.md gives the same sources). The alerts
hold none: they read the checks' states (exporter/health/faults.py)."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.options import RUN, SIMULATE, setting

_C = (RUN, SIMULATE)


@dataclass(frozen=True)
class HealthSettings:
    xid_hold_seconds: float = setting(
        10800.0, "how long an XID keeps its GPU's verdict after it was last seen "
        "(NVSentinel's 3 h window for sticky XIDs)", key="health_xid_hold_seconds",
        low=1.0, high=30 * 86400.0, commands=_C)
    pcie_replays_per_lane_per_minute: float = setting(
        0.15, "PCIe replays per minute and lane a Gen1 link may have before the check "
        "warns; each generation doubles it, and the limit is ceil(rate x lanes) (DCGM's "
        "DcgmGPUHardwareLimits.h: Gen4 x16 16/min, Gen5 x16 31/min)",
        key="health_pcie_replays_per_lane_per_minute", low=0.0, high=1e6, commands=_C)
    pcie_load_ratio: float = setting(
        0.5, "GPU utilization above which a PCIe link below its maximum generation or "
        "width counts (links slow down at idle by design): the pcie_link and pcie_link_width "
        "checks", key="health_pcie_load_ratio", low=0.0, high=1.0, commands=_C)
    retired_pages_max: float = setting(
        63.0, "retired pages (single- plus double-bit) at which the memory check fails "
        "(DCGM 4.x)", key="health_retired_pages_max", low=1.0, high=1e6, commands=_C)
    retired_dbe_pages_max: float = setting(
        15.0, "double-bit retired pages above which a new one in the past week fails the "
        "memory check (DCGM 4.x)", key="health_retired_dbe_pages_max", low=0.0, high=1e6,
        commands=_C)
    retired_dbe_new_pages_per_week: float = setting(
        1.0, "new double-bit retired pages in a week above which, past "
        "health_retired_dbe_pages_max, the memory check fails (DCGM 4.x)",
        key="health_retired_dbe_new_pages_per_week", low=0.0, high=1e6, commands=_C)
    remapped_rows_uncorrectable_max: float = setting(
        512.0, "rows remapped for uncorrectable errors at which the memory check warns "
        "(DCGM 4.x)", key="health_remapped_rows_uncorrectable_max", low=1.0, high=1e9,
        commands=_C)
    nvlink_replays_per_minute: float = setting(
        1.0, "NVLink replay or recovery errors in a minute at which the nvlink_replays check "
        "fails (DCGM 4.x)", key="health_nvlink_replays_per_minute", low=0.0, high=1e9,
        commands=_C)
    nvlink_crc_per_minute: float = setting(
        1.0, "NVLink CRC errors in a minute at which the nvlink_errors check warns (DCGM 4.x)",
        key="health_nvlink_crc_per_minute", low=0.0, high=1e12, commands=_C)
    nvlink_crc_per_second: float = setting(
        100.0, "NVLink CRC errors a second at which the nvlink_errors check fails (DCGM 4.x)",
        key="health_nvlink_crc_per_second", low=0.0, high=1e12, commands=_C)
    infiniband_symbol_errors_per_second: float = setting(
        10.0, "InfiniBand symbol errors a second (over 5 minutes) above which the "
        "infiniband_symbol_errors check warns on the port (NVSentinel's NIC monitor)",
        key="health_infiniband_symbol_errors_per_second", low=0.0, high=1e12, commands=_C)
    infiniband_link_error_recovery_per_minute: float = setting(
        5.0, "InfiniBand link error recoveries a minute (over 5 minutes) above which the "
        "infiniband_link_error_recovery check warns on the port (NVSentinel's NIC monitor)",
        key="health_infiniband_link_error_recovery_per_minute", low=0.0, high=1e9,
        commands=_C)
    window_seconds: float = setting(
        60.0, "the window over which counters are compared: DCGM's health watches compare "
        "the change over the last minute", key="health_window_seconds", low=10.0,
        high=3600.0, commands=_C)
