"""gpu_health_check_state and gpu_node_health_check_state: one series per check that says
something (warning, failed or unknown; per port for the InfiniBand checks), value 1, naming
the check's current state, in every profile (the hardware and fabric alerts read them)."""

from __future__ import annotations

from dataclasses import replace

from exporter.collectors.infiniband.reading import (
    InfinibandDevice,
    InfinibandPort,
    InfinibandReading,
)
from exporter.families import MINIMAL
from exporter.health.monitor import GPU_CHECKS, PORT_CHECKS, HealthMonitor
from exporter.metrics.health import CHECK_STATE, NODE_CHECK_STATE, verdict_families
from exporter.sampling.snapshot import CollectorResult
from tests.tools import make_snapshot

T0 = 1_790_000_000.0


def ib_node(gpus: int, ports: int, down: int | None = None):
    devices = tuple(InfinibandDevice(f"mlx5_{i}", ports=(InfinibandPort(
        f"mlx5_{i}", 1, state_id=1 if i == down else 4, counters={"link_downed": 0.0}),))
        for i in range(ports))
    return make_snapshot(gpus, time=T0, collectors={"infiniband": CollectorResult(
        InfinibandReading(devices, {}), 0.0, True, 0, last_success=T0)})


def series(snapshot) -> dict[str, list]:
    health = HealthMonitor().assess(snapshot)
    return {m.name: m.samples for m in verdict_families(health, snapshot)}


def test_every_profile_serves_the_checks_states():
    assert CHECK_STATE.profile == MINIMAL and NODE_CHECK_STATE.profile == MINIMAL


def test_one_series_per_check_that_is_not_ok_on_an_eight_gpu_node():
    snapshot = ib_node(8, 8, down=3)
    health = HealthMonitor().assess(snapshot)
    found = series(snapshot)
    gpu = found["gpu_health_check_state"]
    assert {s.value for s in gpu} == {1.0}
    for index, verdict in health.gpus.items():
        served = {s.labels["check"]: s.labels["state"] for s in gpu
                  if s.labels["gpu"] == str(index)}
        assert served == {c.name: c.state for c in verdict.checks
                          if c.state in ("warning", "failed", "unknown")}
    # the first judgement: the rate checks cannot judge yet (unknown), the rest are ok or
    # not applicable and are not served
    assert 0 < len(gpu) < 8 * len(GPU_CHECKS)
    node = found["gpu_node_health_check_state"]
    down = [s.labels for s in node if s.labels["check"] == "infiniband_ports"
            and s.labels["state"] == "failed"]
    assert down == [{"check": "infiniband_ports", "device": "mlx5_3", "port": "1",
                     "state": "failed"}]
    assert not [s for s in node if s.labels["check"] == "gpu_count"]  # ok: not served
    assert {s.labels["state"] for s in node} <= {"warning", "failed", "unknown"}


def test_a_check_turning_ok_again_is_no_longer_served():
    monitor = HealthMonitor()
    down = ib_node(2, 2, down=1)
    first = {m.name: m.samples for m in verdict_families(monitor.assess(down), down)}
    assert any(s.labels["check"] == "infiniband_ports"
               for s in first["gpu_node_health_check_state"])
    up = replace(ib_node(2, 2), time=T0 + 10)
    again = {m.name: m.samples for m in verdict_families(monitor.assess(up), up)}
    assert not any(s.labels["check"] == "infiniband_ports"
                   for s in again["gpu_node_health_check_state"])


def test_a_node_without_ports_serves_no_port_check():
    node = series(make_snapshot(2))["gpu_node_health_check_state"]
    assert not [s for s in node if s.labels["check"] in {c.name for c in PORT_CHECKS}]


def test_a_lost_gpu_is_its_own_checks_and_a_missing_one_the_nodes():
    """GpusBelowExpected reads gpu_count (GPUs NVML counts), GpuLost gpu_answering."""
    lost = HealthMonitor().assess(make_snapshot(4, time=T0, lost=frozenset({2})))
    count = next(c for c in lost.node.checks if c.name == "gpu_count")
    assert (count.state, count.value) == ("ok", 4)
    answering = next(c for c in lost.gpus[2].checks if c.name == "gpu_answering")
    assert (answering.state, answering.action) == ("failed", "reboot_node")
    snapshot = make_snapshot(3, time=T0)
    missing = HealthMonitor().assess(replace(snapshot, expected_gpus=4))
    count = next(c for c in missing.node.checks if c.name == "gpu_count")
    assert (count.state, count.value, count.threshold, count.action) == (
        "failed", 3, 4, "reboot_node")
