"""The health verdict: checks on hand-made snapshots, the verdict's worst state, one
action and its reasons, judged once per snapshot, and /api/v1/health's shape."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest

from exporter.collectors.infiniband.reading import (
    InfinibandDevice,
    InfinibandPort,
    InfinibandReading,
)
from exporter.gpu.board import BoardRead, FabricInfo
from exporter.gpu.device_read import DeviceRead
from exporter.gpu.reading import GpuReading
from exporter.health.context import Check
from exporter.health.model import FAILED, OK, Outcome
from exporter.health.monitor import GPU_CHECKS, HealthMonitor
from exporter.sampling.snapshot import CollectorResult, XidRecord
from exporter.web.api import health_body
from tests.tools import ExporterFactory, http_get, make_snapshot


def device_read(time: float = 1.0, **fields) -> DeviceRead:
    values = {"time": time, "ecc_errors": {("uncorrected", "volatile"): 0.0},
              "retired_pages": {}, "retired_pages_pending": None,
              "remapped_rows": {"uncorrectable": 0.0}, "row_remap_pending": 0.0,
              "row_remap_failure": 0.0, "recovery_action": "none", "nvlinks": ()}
    return DeviceRead(**{**values, **fields})


LINK = MappingProxyType({"pcie_max_generation": 5.0, "pcie_max_width": 16.0,
                         "pcie_generation": 5.0, "pcie_width": 16.0,
                         "utilization_gpu_ratio": 0.9})


FABRIC = FabricInfo("completed", "Success", 2 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8, 1,
                    "11111111-2222-3333-4444-555555555555")


def board(time: float = 1.0, fabric: FabricInfo | None = FABRIC, error: str | None = None,
          inforom: bool | None = True) -> BoardRead:
    return BoardRead(time, fabric, error, inforom, None)


def snap(time: float = 10.0, gpus: int = 2, **fields):
    """A snapshot of `gpus` healthy GPUs (no counters: the rate checks do not apply)."""
    fields.setdefault("device_reads", {g: device_read(time) for g in range(gpus)})
    fields.setdefault("readings", {g: GpuReading(time, LINK) for g in range(gpus)})
    fields.setdefault("board", {g: board(time) for g in range(gpus)})
    return make_snapshot(gpus, time=time, **fields)


def check(node_health, gpu: int, name: str):
    return next(c for c in node_health.gpus[gpu].checks if c.name == name)


def test_a_healthy_node_is_ok_with_no_action():
    result = HealthMonitor().assess(snap())
    assert result.node.state == OK and result.node.action == "none"
    assert result.node.reasons == ""
    assert {v.state for v in result.gpus.values()} == {OK}


def test_a_lost_gpu_fails_and_asks_for_a_reboot():
    result = HealthMonitor().assess(snap(lost=frozenset({1}), device_reads={0: device_read(10.0)}))
    gpu = result.gpus[1]
    assert (gpu.state, gpu.action) == (FAILED, "reboot_node")
    assert gpu.reasons == "GPU 1: GPU lost (fell off the bus)"  # not the unread memory
    assert check(result, 1, "ecc_uncorrected").state == "unknown"
    assert result.gpus[0].state == OK
    assert (result.node.state, result.node.action) == (FAILED, "reboot_node")
    assert result.node.reasons == "GPU 1: GPU lost (fell off the bus)"


def test_a_hung_gpu_fails_and_asks_for_a_reset():
    result = HealthMonitor().assess(snap(hung={0: 4.0}))
    assert (result.gpus[0].state, result.gpus[0].action) == (FAILED, "reset_gpu")
    assert check(result, 0, "gpu_answering").value == 6.0


@pytest.mark.parametrize("code, state, action", [
    (13, OK, "none"), (45, OK, "none"), (31, "warning", "restart_application"),
    (43, "warning", "restart_application"), (94, "warning", "restart_application"),
    (63, "warning", "reset_gpu"), (48, FAILED, "reset_gpu"), (79, FAILED, "reboot_node"),
    (64, FAILED, "drain_and_service"), (95, FAILED, "reset_gpu"), (119, FAILED, "reset_gpu"),
    (120, FAILED, "reset_gpu"), (140, FAILED, "reset_gpu"), (74, FAILED, "reset_gpu"),
    (999, "warning", "none")])
def test_xids_by_the_catalogs_action(code, state, action):
    result = HealthMonitor().assess(snap(xids={(1, code): XidRecord(1, 9.0)}))
    assert (result.gpus[1].state, result.gpus[1].action) == (state, action)
    assert check(result, 1, "xid").value == code
    assert result.gpus[0].state == OK


def test_the_worst_xid_wins_and_old_ones_age_out():
    xids = {(0, 94): XidRecord(3, 9.0), (0, 79): XidRecord(1, 8.0)}
    result = HealthMonitor().assess(snap(xids=xids))
    assert (result.gpus[0].action, check(result, 0, "xid").value) == ("reboot_node", 79)
    later = 9.0 + 10800.0 + 1
    result = HealthMonitor().assess(snap(time=later, xids=xids))
    assert result.gpus[0].state == OK


def test_an_application_xid_alone_never_fails():
    for code in (13, 31, 43, 45):
        result = HealthMonitor().assess(snap(xids={(0, code): XidRecord(50, 9.0)}))
        assert result.gpus[0].state != FAILED


@pytest.mark.parametrize("fields, name, state, action", [
    ({"ecc_errors": {("uncorrected", "volatile"): 1.0}}, "ecc_uncorrected", FAILED,
     "reset_gpu"),
    ({"row_remap_failure": 1.0}, "row_remap_failure", FAILED, "drain_and_service"),
    ({"row_remap_pending": 1.0}, "row_remap_pending", "warning", "reset_gpu"),
    ({"retired_pages_pending": 1.0}, "retired_pages_pending", "warning", "reset_gpu"),
    ({"recovery_action": "node_reboot"}, "recovery_action", FAILED, "reboot_node"),
    ({"recovery_action": "gpu_reset"}, "recovery_action", FAILED, "reset_gpu"),
])
def test_memory_and_recovery_action(fields, name, state, action):
    result = HealthMonitor().assess(snap(device_reads={0: device_read(10.0, **fields),
                                                 1: device_read(10.0)}))
    assert check(result, 0, name).state == state
    assert (result.gpus[0].state, result.gpus[0].action) == (state, action)
    assert result.gpus[1].state == OK


def test_retired_pages_just_below_and_at_the_limit():
    def judged(sbe: float, dbe: float) -> str:
        h = device_read(10.0, retired_pages={"single_bit": sbe, "double_bit": dbe})
        return check(HealthMonitor().assess(snap(device_reads={0: h, 1: device_read()})), 0,
                     "retired_pages").state
    assert judged(50, 12) == OK  # 62
    assert judged(50, 13) == FAILED  # 63


def test_remapped_rows_just_below_and_at_the_limit():
    def judged(rows: float) -> str:
        h = device_read(10.0, remapped_rows={"uncorrectable": rows})
        return check(HealthMonitor().assess(snap(device_reads={0: h, 1: device_read()})), 0,
                     "remapped_rows").state
    assert judged(511) == OK
    assert judged(512) == "warning"


def test_dbe_pages_past_15_fail_only_with_more_than_one_new_in_a_week():
    monitor = HealthMonitor()

    def at(time: float, dbe: float) -> str:
        h = device_read(time, retired_pages={"single_bit": 0.0, "double_bit": dbe})
        return check(monitor.assess(snap(time, device_reads={0: h, 1: device_read(time)})), 0,
                     "retired_pages_recent").state
    assert at(10.0, 16) == OK  # many, but none new yet
    assert at(20.0, 17) == OK  # one new: at the limit, not above
    assert at(30.0, 18) == FAILED  # two new in the week
    assert at(30.0 + 8 * 86400, 18) == OK  # none new in the last week


def test_missing_data_is_unknown_or_not_applicable_never_failed():
    result = HealthMonitor().assess(snap(device_reads={}))
    states = {c.state for v in result.gpus.values() for c in v.checks}
    assert FAILED not in states and "unknown" in states
    bare = device_read(10.0, ecc_errors={}, remapped_rows={}, row_remap_pending=None,
                  row_remap_failure=None, recovery_action=None)
    result = HealthMonitor().assess(snap(device_reads={0: bare, 1: bare}))
    assert {c.state for c in result.gpus[0].checks} <= {OK, "not_applicable"}


def test_a_check_that_raises_is_unknown_and_counted_and_the_others_go_on():
    def broken(_inputs) -> Outcome:
        raise ZeroDivisionError

    monitor = HealthMonitor(gpu_checks=(*GPU_CHECKS, Check("broken", "test", broken)))
    result = monitor.assess(snap(lost=frozenset({1})))
    assert check(result, 0, "broken").state == "unknown"
    assert result.gpus[1].state == FAILED
    assert dict(result.check_errors) == {"broken": 2}


def test_judged_once_per_snapshot_and_since_holds_while_the_state_does():
    monitor = HealthMonitor()
    first = snap(10.0)
    assert monitor.assess(first) is monitor.assess(first)
    failing = {0: device_read(20.0, row_remap_failure=1.0), 1: device_read(20.0)}
    at_20 = monitor.assess(snap(20.0, device_reads=failing))
    at_25 = monitor.assess(snap(25.0, device_reads={g: h.__class__(**{**h.__dict__, "time": 25.0})
                                              for g, h in failing.items()}))
    assert check(at_20, 0, "row_remap_failure").since == 20.0
    assert check(at_25, 0, "row_remap_failure").since == 20.0
    assert check(at_25, 1, "row_remap_failure").since == 10.0


def ports_read(time: float, down: bool = False) -> dict:
    """The InfiniBand collector's result of `time`: one port, up or down."""
    port = InfinibandPort("mlx5_0", 1, state_id=1 if down else 4,
                          counters={"link_downed": 0.0})
    return {"infiniband": CollectorResult(InfinibandReading(
        (InfinibandDevice("mlx5_0", ports=(port,)),), {}), 0.0, True, 0,
        last_success=time)}


def test_a_new_ports_read_judges_the_ports_again_and_keeps_the_gpus_verdicts():
    """The ports are read at their own times: a snapshot where they alone have moved
    keeps the GPUs' verdicts (their checks are not run again) and judges the node's; a
    snapshot where the GPUs' reads have moved judges the GPUs again."""
    calls: list[int] = []

    def counted(inputs) -> Outcome:
        calls.append(inputs.gpu)
        return Outcome(OK)

    monitor = HealthMonitor(gpu_checks=(*GPU_CHECKS, Check("counted", "test", counted)))
    at_10 = snap(10.0, collectors=ports_read(10.0))
    first = monitor.assess(at_10)
    assert calls == [0, 1] and first.node.state != FAILED  # its rates not known yet
    gpus_as_at_10 = {"device_reads": at_10.device_reads, "board": at_10.board,
                     "readings": at_10.readings}
    port_down = monitor.assess(snap(12.0, collectors=ports_read(12.0, down=True),
                                    **gpus_as_at_10))
    assert calls == [0, 1]  # the GPUs' checks were not run again ...
    assert all(port_down.gpus[g] is first.gpus[g] for g in (0, 1))  # ... their verdicts kept
    assert port_down.node.state == FAILED
    assert "InfiniBand port mlx5_0/1 down" in port_down.node.reasons
    reads = {g: device_read(15.0) for g in (0, 1)}
    monitor.assess(snap(15.0, device_reads=reads, collectors=ports_read(12.0, down=True)))
    assert calls == [0, 1, 0, 1]  # new GPU reads: the GPUs judged again


def test_health_body_has_the_documented_shape():
    result = HealthMonitor().assess(snap(xids={(1, 48): XidRecord(1, 9.0)}))
    body = json.loads(health_body(result))
    assert set(body) == {"summary", "node", "gpus"}
    assert body["summary"] == "failed: GPU 1 (reset the GPU)"
    assert set(body["gpus"]) == {"0", "1"}
    for v in (body["node"], *body["gpus"].values()):
        assert set(v) == {"state", "action", "action_words", "reasons", "checks"}
        for c in v["checks"]:
            assert set(c) == {"name", "state", "value", "threshold", "source", "since",
                              "action", "action_words", "reason"}
    assert body["gpus"]["1"]["state"] == "failed"
    assert body["gpus"]["1"]["action"] == "reset_gpu"
    assert body["gpus"]["1"]["action_words"] == "reset the GPU"
    assert "XID 48" in body["node"]["reasons"]


def test_api_health_and_metrics_share_the_verdict_on_a_running_exporter():
    factory = ExporterFactory()
    try:
        exporter = factory.start(manual=True, scenario="ecc-dbe")
        exporter.sampler.advance(16)
        response, raw = http_get(exporter.port, "/api/v1/health")
        assert response.status == 200
        body = json.loads(raw)
        assert (body["gpus"]["2"]["state"], body["gpus"]["2"]["action"]) == (
            "failed", "reset_gpu")
        assert body["gpus"]["0"]["state"] == "ok"
        text = http_get(exporter.port, "/metrics")[1].decode()
        metric = [line for line in text.splitlines()
                  if line.startswith("gpu_health_state{") and 'gpu="2"' in line
                  and 'state="failed"' in line]
        assert metric and metric[0].endswith(" 1.0")
        assert exporter.current.verdict is exporter.health.assess(exporter.current.snapshot)
        response, raw = http_get(exporter.port, "/api/v1/health?gpu=1")
        assert response.status == 400 and "unknown parameter 'gpu'" in json.loads(raw)["error"]
    finally:
        factory.stop_all()


def test_a_verdict_that_cannot_be_made_is_unknown_and_counted_never_raised(monkeypatch):
    import exporter.health.monitor as monitor_module

    def broken(*_args):
        raise RuntimeError("boom")

    monitor = HealthMonitor()
    with monkeypatch.context() as patch:
        patch.setattr(monitor_module, "combine", broken)  # judging itself, not one check
        result = monitor.assess(snap())
    assert result.node.state == "unknown" and result.node.reasons == "health verdict failed"
    assert set(result.gpus) == {0, 1}
    assert dict(result.check_errors)["verdict"] == 1
    assert monitor.assess(snap(20.0)).node.state == OK  # the next snapshot is judged anew


def test_a_broken_snapshot_fails_its_checks_as_unknown_not_the_publisher():
    bad = snap()
    object.__setattr__(bad, "identities", None)
    result = HealthMonitor().assess(bad)
    assert result.node.state == "unknown"
    assert dict(result.check_errors)["gpu_answering"] == 2
