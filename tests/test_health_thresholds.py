"""Each rate threshold of the health checks on hand-made snapshots: just below its limit,
at it (and past it where the rule is 'above')."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from exporter.gpu.device_read import NvLink
from exporter.gpu.reading import GpuIdentity, GpuReading
from exporter.health.monitor import HealthMonitor
from tests.test_health_verdict import check, device_read, snap

BASE = {"pcie_max_generation": 5.0, "pcie_max_width": 16.0, "pcie_generation": 5.0,
        "pcie_width": 16.0, "utilization_gpu_ratio": 0.9, "pcie_replays": 0.0,
        "clock_event_thermal_seconds": 0.0, "clock_event_hw_power_brake_slowdown_seconds": 0.0}


def reading(time: float, **values) -> GpuReading:
    return GpuReading(time, MappingProxyType({**BASE, **values}))


def two_reads(name: str, first: dict, second: dict, device_fields=None, seconds=60.0):
    """The check's state after two reads `seconds` apart (values as given)."""
    monitor = HealthMonitor()
    result = None
    for time, values in ((10.0, first), (10.0 + seconds, second)):
        h = device_read(time, **(device_fields(values) if device_fields else {}))
        result = monitor.assess(snap(time, device_reads={0: h, 1: device_read(time)},
                                     readings={0: reading(time, **({} if device_fields
                                                               else values))}))
    return check(result, 0, name)


@pytest.mark.parametrize("gen, width, limit", [(5, 16, 31), (4, 16, 16), (3, 16, 8),
                                                (5, 8, 16)])
def test_pcie_replays_at_and_above_ceil_rate_times_lanes(gen, width, limit):
    link = {"pcie_generation": float(gen), "pcie_width": float(width),
            "pcie_max_generation": float(gen), "pcie_max_width": float(width)}
    at = two_reads("pcie_replays", {**link, "pcie_replays": 100.0},
                   {**link, "pcie_replays": 100.0 + limit})
    assert (at.state, at.threshold) == ("ok", limit)
    above = two_reads("pcie_replays", {**link, "pcie_replays": 100.0},
                      {**link, "pcie_replays": 101.0 + limit})
    assert above.state == "warning"


def test_pcie_replay_rate_is_unknown_before_a_second_read():
    result = HealthMonitor().assess(snap(readings={0: reading(10.0)}))
    assert check(result, 0, "pcie_replays").state == "unknown"


def test_pcie_link_below_its_maximum_counts_only_under_load():
    slow = {"pcie_generation": 4.0}
    busy = two_reads("pcie_link", slow, {**slow, "utilization_gpu_ratio": 0.51})
    assert (busy.state, busy.value, busy.threshold) == ("warning", "gen4 x16", "gen5 x16")
    at = two_reads("pcie_link", slow, {**slow, "utilization_gpu_ratio": 0.5})
    assert at.state == "ok"
    # generation and width are two checks (two alerts): a narrow link warns on its own
    narrow = {"pcie_width": 8.0, "utilization_gpu_ratio": 0.9}
    assert two_reads("pcie_link_width", {}, narrow).state == "warning"
    assert two_reads("pcie_link", {}, narrow).state == "ok"
    assert two_reads("pcie_link_width", slow, {**slow, "utilization_gpu_ratio": 0.9}
                     ).state == "ok"


def links(values: dict) -> dict:
    return {"nvlinks": tuple(NvLink(i, True, errors={"replay": values.get("replay", 0.0),
                                                     "recovery": 0.0,
                                                     "crc_flit": values.get("crc", 0.0),
                                                     "crc_data": 0.0} if i == 0 else {})
                             for i in range(2))}


def test_nvlink_replays_fail_at_one_a_minute():
    assert two_reads("nvlink_replays", {}, {"replay": 0.0}, links).state == "ok"
    failed = two_reads("nvlink_replays", {}, {"replay": 1.0}, links)
    assert (failed.state, failed.threshold, failed.action) == ("failed", 1.0, "reset_gpu")
    # the CRC check is another one (its own alerts)
    assert two_reads("nvlink_errors", {}, {"replay": 1.0}, links).state == "ok"


def test_nvlink_crc_warns_at_one_and_fails_at_100_a_second():
    assert two_reads("nvlink_errors", {}, {"crc": 0.0}, links).state == "ok"
    assert two_reads("nvlink_errors", {}, {"crc": 1.0}, links).state == "warning"
    below = two_reads("nvlink_errors", {}, {"crc": 99.0 * 60}, links)
    assert below.state == "warning"
    assert two_reads("nvlink_errors", {}, {"crc": 100.0 * 60}, links).state == "failed"


def test_nvlink_down_fails_and_pcie_cards_are_not_applicable():
    down = {"nvlinks": (NvLink(0, True), NvLink(1, False))}
    idents = tuple(GpuIdentity(i, f"GPU-{i}", "H100", "", "", nvlinks=2 if i == 0 else 0)
                   for i in range(2))
    result = HealthMonitor().assess(snap(device_reads={0: device_read(10.0, **down),
                                                       1: device_read(10.0)},
                                         identities=idents))
    links_check = check(result, 0, "nvlink_links")
    assert (links_check.state, links_check.value, links_check.threshold) == ("failed", 1, 2)
    assert result.gpus[0].action == "reset_gpu"
    assert check(result, 1, "nvlink_links").state == "not_applicable"
    assert check(result, 1, "nvlink_errors").state == "not_applicable"
    assert check(result, 1, "nvlink_replays").state == "not_applicable"


@pytest.mark.parametrize("name, key", [
    ("thermal_violation", "clock_event_thermal_seconds"),
    ("power_violation", "clock_event_hw_power_brake_slowdown_seconds")])
def test_violation_time_rising_warns(name, key):
    assert two_reads(name, {key: 5.0}, {key: 5.0}).state == "ok"
    assert two_reads(name, {key: 5.0}, {key: 5.001}).state == "warning"
