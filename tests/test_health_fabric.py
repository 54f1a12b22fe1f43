"""The NVLink fabric and InfoROM checks: passing, failing and not applicable, on
hand-made board readings and on the fake through pynvml (nvmlDeviceGetGpuFabricInfoV,
nvmlDeviceValidateInforom)."""

from __future__ import annotations

import dataclasses

import pytest

from exporter.health.monitor import HealthMonitor
from tests.test_health_verdict import FABRIC, board, check, snap
from tests.tools import ExporterFactory


def judged(*boards):
    return HealthMonitor().assess(snap(gpus=len(boards),
                                       board=dict(enumerate(boards))))


def test_a_registered_healthy_fabric_passes():
    result = judged(board(), board())
    assert check(result, 0, "nvlink_fabric").state == "ok"
    node = next(c for c in result.node.checks if c.name == "nvlink_fabric")
    assert (node.state, node.value) == ("ok", FABRIC.cluster_uuid)


@pytest.mark.parametrize("change, value", [
    ({"state": "not_started"}, "not_started"), ({"state": "in_progress"}, "in_progress"),
    ({"status": "Unknown"}, "Unknown"),
    ({"health_mask": FABRIC.health_mask & ~0x3 | 1}, "degraded_bandwidth"),
    ({"health_mask": FABRIC.health_mask & ~(0x3 << 4) | 1 << 4}, "route_unhealthy"),
    ({"health_mask": FABRIC.health_mask & ~(0xF << 8) | 4 << 8}, "incorrect_configuration"),
])
def test_a_fabric_not_registered_or_degraded_fails(change, value):
    result = judged(board(fabric=dataclasses.replace(FABRIC, **change)), board())
    got = check(result, 0, "nvlink_fabric")
    assert (got.state, got.value) == ("failed", value)
    assert result.gpus[0].action == "reset_gpu"
    assert check(result, 1, "nvlink_fabric").state == "ok"
    assert result.node.state == "failed"


@pytest.mark.parametrize("fabric, error", [
    (dataclasses.replace(FABRIC, state="not_supported", cluster_uuid=""), None),
    (None, "NotSupported"), (None, "FunctionNotFound")])
def test_pcie_cards_are_not_applicable_never_failed(fabric, error):
    result = judged(board(fabric=fabric, error=error), board(fabric=fabric, error=error))
    assert check(result, 0, "nvlink_fabric").state == "not_applicable"
    node = next(c for c in result.node.checks if c.name == "nvlink_fabric")
    assert node.state == "not_applicable"
    assert result.node.state == "ok"


def test_a_fabric_read_that_failed_is_unknown():
    result = judged(board(fabric=None, error="Unknown"), board())
    assert check(result, 0, "nvlink_fabric").state == "unknown"


def test_gpus_in_two_fabrics_fail_the_node():
    other = dataclasses.replace(FABRIC, cluster_uuid="99999999-2222-3333-4444-555555555555")
    result = judged(board(), board(fabric=other))
    node = next(c for c in result.node.checks if c.name == "nvlink_fabric")
    assert (node.state, node.action) == ("failed", "drain_and_service")


def test_inforom_valid_corrupted_and_not_supported():
    result = judged(board(inforom=True), board(inforom=False))
    assert check(result, 0, "inforom").state == "ok"
    assert (check(result, 1, "inforom").state, result.gpus[1].action) == (
        "failed", "drain_and_service")
    bare = dataclasses.replace(board(), inforom_valid=None, inforom_error="NotSupported")
    assert check(judged(bare, bare), 0, "inforom").state == "not_applicable"


# -- on the fake, through pynvml ----------------------------------------------------------

def health_of(tmp_path, text: str, until: float):
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    factory = ExporterFactory()
    try:
        exporter = factory.start(manual=True, scenario=str(path), gpu_board_interval_seconds=5)
        exporter.sampler.advance(until)
        return exporter.current.verdict, exporter.current.snapshot
    finally:
        factory.stop_all()


def test_the_fake_fabric_registers_and_its_clique_and_cluster_are_read(tmp_path):
    result, snapshot = health_of(tmp_path, "gpus: 2\n", 3)
    assert check(result, 0, "nvlink_fabric").state == "ok"
    fabric = snapshot.board[0].fabric
    assert fabric.clique_id == 1 and len(fabric.cluster_uuid) == 36
    assert snapshot.board[1].fabric.cluster_uuid == fabric.cluster_uuid


def test_the_fake_fabric_that_never_registers(tmp_path):
    text = "gpus: 2\nevents:\n  - {kind: fabric, at: 0, gpu: 1, state: not_started}\n"
    result, _ = health_of(tmp_path, text, 3)
    assert check(result, 1, "nvlink_fabric").state == "failed"
    assert check(result, 0, "nvlink_fabric").state == "ok"


def test_the_fake_fabric_that_degrades_is_seen_at_the_next_board_read(tmp_path):
    text = "gpus: 2\nevents:\n  - {kind: fabric, at: 8, gpu: 0, degraded: true}\n"
    result, _ = health_of(tmp_path, text, 4)
    assert check(result, 0, "nvlink_fabric").state == "ok"
    result, _ = health_of(tmp_path, text, 14)
    assert check(result, 0, "nvlink_fabric").value == "degraded_bandwidth"


def test_a_pcie_card_on_the_fake_is_not_applicable(tmp_path):
    result, _ = health_of(tmp_path, "gpus: 2\ndevice: {nvlinks: 0, fabric: false}\n", 12)
    assert check(result, 0, "nvlink_fabric").state == "not_applicable"
    assert result.node.state == "ok"


def test_a_corrupt_inforom_on_the_fake(tmp_path):
    text = ("gpus: 2\nevents:\n  - {kind: error, at: 0, gpu: 1, "
            "call: nvmlDeviceValidateInforom, error: CorruptedInforom}\n")
    result, _ = health_of(tmp_path, text, 3)
    assert check(result, 1, "inforom").state == "failed"
    assert check(result, 0, "inforom").state == "ok"


def test_a_bad_fabric_fault_is_refused_with_its_key():
    from exporter.sim.scenarios import parse_scenario
    from exporter.yamlfile import ConfigError

    with pytest.raises(ConfigError, match="state"):
        parse_scenario({"events": [{"kind": "fabric", "at": 1, "state": "broken"}]},
                       "test.yaml", "test")
