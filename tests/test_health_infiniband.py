"""The InfiniBand checks of the node's verdict, judged per port: a port DOWN or not active,
link errors in the window, and symbol errors or link error recoveries past their settings'
rates (NVSentinel's NIC monitor; alerts/fabric.yml reads these checks' states)."""

from __future__ import annotations

import pytest

from exporter.collectors.infiniband.reading import (
    InfinibandDevice,
    InfinibandPort,
    InfinibandReading,
)
from exporter.health.monitor import HealthMonitor
from exporter.health.settings import HealthSettings
from exporter.sampling.snapshot import CollectorResult
from tests.tools import make_snapshot

T0 = 1_790_000_000.0


def ib_snapshot(t: float, state: int = 4, **counters: float):
    port = InfinibandPort("mlx5_0", 1, state_id=state, counters=counters)
    quiet = InfinibandPort("mlx5_1", 1, state_id=4, counters={"link_downed": 0.0})
    reading = InfinibandReading((InfinibandDevice("mlx5_0", ports=(port,)),
                                 InfinibandDevice("mlx5_1", ports=(quiet,))), {})
    return make_snapshot(1, time=T0 + t, collectors={
        "infiniband": CollectorResult(reading, 0.0, True, 0, last_success=T0 + t)})


CHECK_OF = {"link_downed": "infiniband_link_downed",
            "excessive_buffer_overrun_errors": "infiniband_buffer_overrun",
            "local_link_integrity_errors": "infiniband_link_integrity",
            "rnr_nak_retry_err": "infiniband_rnr_retry",
            "symbol_error": "infiniband_symbol_errors",
            "link_error_recovery": "infiniband_link_error_recovery"}


def port_check(monitor: HealthMonitor, snapshot, name: str, port: str = "mlx5_0/1"):
    node = monitor.assess(snapshot).node
    return next(c for c in node.checks if c.name == name and c.port == port)


def judged(readings, counter: str, settings: HealthSettings | None = None, port="mlx5_0/1"):
    """The counter's check of the port after each (t, counters) reading, in order."""
    monitor = HealthMonitor(settings)
    return [port_check(monitor, ib_snapshot(t, **counters), CHECK_OF[counter], port)
            for t, counters in readings]


def test_a_node_without_infiniband_is_not_applicable():
    checks = [c for c in HealthMonitor().assess(make_snapshot(1)).node.checks
              if c.name.startswith("infiniband_")]
    assert {c.name for c in checks} == {"infiniband_ports", *CHECK_OF.values()}
    assert {(c.state, c.port) for c in checks} == {("not_applicable", "")}


def test_a_rate_needs_a_second_read_then_quiet_ports_pass():
    first, second = judged([(0, {"link_downed": 0.0}), (10, {"link_downed": 0.0})],
                           "link_downed")
    assert first.state == "unknown"
    assert second.state == "ok"


def test_a_counter_the_port_lacks_is_not_applicable():
    (check,) = judged([(0, {"link_downed": 0.0})], "symbol_error")
    assert check.state == "not_applicable"


@pytest.mark.parametrize("counter", ["link_downed", "excessive_buffer_overrun_errors",
                                     "local_link_integrity_errors"])
def test_any_link_error_in_the_window_fails_its_port_and_ages_out(counter):
    checks = judged([(0, {counter: 3.0}), (10, {counter: 4.0}), (200, {counter: 4.0}),
                     (320, {counter: 4.0})], counter)
    assert [c.state for c in checks] == ["unknown", "failed", "failed", "ok"]
    assert (checks[1].value, checks[1].port) == (1.0, "mlx5_0/1")
    assert checks[1].action == "drain_and_service"
    # the quiet port's check is its own, and passes
    quiet = judged([(0, {counter: 3.0}), (10, {counter: 4.0})], "link_downed",
                   port="mlx5_1/1")
    assert quiet[-1].state == "ok"


def test_rnr_retries_are_read_from_the_hw_counters():
    monitor = HealthMonitor()
    for t, value, state in ((0, 0.0, "unknown"), (10, 2.0, "failed")):
        port = InfinibandPort("mlx5_0", 1, state_id=4, hw_counters={"rnr_nak_retry_err": value})
        reading = InfinibandReading((InfinibandDevice("mlx5_0", ports=(port,)),), {})
        snap = make_snapshot(1, time=T0 + t, collectors={
            "infiniband": CollectorResult(reading, 0.0, True, 0, last_success=T0 + t)})
        assert port_check(monitor, snap, "infiniband_rnr_retry").state == state


@pytest.mark.parametrize(("state", "expected", "action"), [
    (1, "failed", "drain_and_service"), (2, "warning", "none"), (3, "warning", "none"),
    (4, "ok", "none"), (5, "ok", "none")])
def test_a_port_down_fails_and_one_not_active_warns(state, expected, action):
    check = port_check(HealthMonitor(), ib_snapshot(0, state=state), "infiniband_ports")
    assert (check.state, check.action) == (expected, action)


@pytest.mark.parametrize(("counter", "per_second_at_limit", "setting"), [
    ("symbol_error", 10.0, "infiniband_symbol_errors_per_second"),
    ("link_error_recovery", 5.0 / 60, "infiniband_link_error_recovery_per_minute"),
])
def test_error_rates_warn_just_above_their_setting_and_move_with_it(
        counter, per_second_at_limit, setting):
    def states(rate: float, settings: HealthSettings | None = None) -> list[str]:
        readings = [(t, {counter: rate * t}) for t in (0.0, 100.0, 300.0)]
        return [c.state for c in judged(readings, counter, settings)]

    assert states(per_second_at_limit)[-1] == "ok"  # at the limit: not above it
    assert states(per_second_at_limit * 1.05)[-1] == "warning"
    doubled = HealthSettings(**{setting: getattr(HealthSettings(), setting) * 2})
    assert states(per_second_at_limit * 1.05, doubled)[-1] == "ok"
    assert states(per_second_at_limit * 2.1, doubled)[-1] == "warning"


def test_a_port_whose_state_was_not_read_is_unknown_never_failed():
    port = InfinibandPort("mlx5_0", 1, state_id=None, counters={})
    reading = InfinibandReading((InfinibandDevice("mlx5_0", ports=(port,)),), {})
    snap = make_snapshot(1, time=T0, collectors={
        "infiniband": CollectorResult(reading, 0.0, True, 0, last_success=T0)})
    monitor = HealthMonitor()
    assert port_check(monitor, snap, "infiniband_ports").state == "unknown"
    assert port_check(monitor, snap, "infiniband_link_downed").state == "not_applicable"


def test_the_api_names_each_ports_check_by_its_device_and_port():
    """/api/v1/health serves a per-port check with its device and port (the labels of
    gpu_node_health_check_state), so two ports' checks are not one name twice; a check
    of the node as a whole has neither."""
    import json

    from exporter.web.api import health_body

    monitor = HealthMonitor()
    monitor.assess(ib_snapshot(0, link_downed=3.0))
    body = json.loads(health_body(monitor.assess(ib_snapshot(10, state=1, link_downed=4.0))))
    checks = body["node"]["checks"]
    downed = [c for c in checks if c["name"] == "infiniband_link_downed"]
    assert sorted((c["device"], c["port"], c["state"]) for c in downed) == [
        ("mlx5_0", "1", "failed"), ("mlx5_1", "1", "ok")]
    ports = {(c["device"], c["port"]): c["state"] for c in checks
             if c["name"] == "infiniband_ports"}
    assert ports == {("mlx5_0", "1"): "failed", ("mlx5_1", "1"): "ok"}
    count = next(c for c in checks if c["name"] == "gpu_count")
    assert "device" not in count and "port" not in count
    # no InfiniBand: the ports' checks judge the node as a whole (not applicable)
    bare = json.loads(health_body(HealthMonitor().assess(make_snapshot(1))))
    assert all("port" not in c for c in bare["node"]["checks"])
