"""One judge: a health setting changed in one place moves the verdict, the page's finding,
the history's episode and the alert's threshold together (NVLink, memory, PCIe,
InfiniBand, XIDs), and the committed rule files carry the settings' defaults."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from exporter.gpu.health import NvLink
from exporter.health.alert_rules import FILES, THRESHOLDS, alert_block, apply
from exporter.health.monitor import HealthMonitor, Published
from exporter.health.settings import HealthSettings
from exporter.history.recorder import CHECK_KINDS
from exporter.sampling.snapshot import XidRecord
from exporter.web.findings import findings
from tests.test_health_infiniband import ib_snapshot
from tests.test_health_verdict import LINK, health, snap
from tests.test_history_store import history as open_history
from tests.tools import REPO, require_binary

GPU = 1


def nvlink_crc(t: float, crc: float):
    links = (NvLink(0, True, errors={"crc_flit": crc, "replay": 0.0}),)
    return snap(t, device_reads={g: health(t, nvlinks=links if g == GPU else ()) for g in range(2)})


def retired(t: float, pages: float):
    return snap(t, device_reads={g: health(t, retired_pages={"single_bit": pages} if g == GPU
                                     else {}) for g in range(2)})


def pcie_gen4(t: float, _: float):
    from exporter.gpu.state import GpuState
    slow = GpuState(t, {**LINK, "pcie_generation": 4.0})
    return snap(t, states={g: slow if g == GPU else GpuState(t, LINK) for g in range(2)})


def xid_hours_ago(t: float, hours: float):
    return snap(t, xids={(GPU, 48): XidRecord(1, t - hours * 3600)})


# setting, its changed value, snapshots (t, value), the check, state with the default
# and with the change, the page's finding kind (None: the verdict panel alone), the alert
CASES = {
    "nvlink": ("nvlink_crc_per_minute", 60.0, nvlink_crc, [(0, 0.0), (60, 30.0)],
               "nvlink_errors", "warning", "ok", "nvlink", "GpuNvlinkCrcErrors"),
    "memory": ("retired_pages_max", 32.0, retired, [(0, 40.0)], "retired_pages", "ok",
               "failed", "retired_pages", "GpuRetiredPagesHigh"),
    "pcie": ("pcie_load_ratio", 0.95, pcie_gen4, [(0, 0.0)], "pcie_link", "warning", "ok",
             None, "GpuPcieLinkGenerationDegraded"),
    "xid": ("xid_hold_seconds", 3600.0, xid_hours_ago, [(10_000, 1.5)], "xid", "failed",
            "ok", "xid", None),
}


def judge(settings: HealthSettings, make, readings, history=None):
    """The verdict on each reading, as the app judges it, the history seeing both."""
    monitor = HealthMonitor(settings)
    for t, value in readings:
        snapshot = make(t, value)
        verdict = monitor.assess(snapshot)
        if history is not None:
            history.observe(snapshot)
            history.observe_health(verdict)
    return snapshot, verdict


def episode_kinds(history) -> set[str]:
    kinds = {e.kind for e in history.recent}
    history.stop()
    return kinds


def severity(state: str) -> str:
    return {"failed": "critical", "warning": "warning"}.get(state, "info")


@pytest.mark.parametrize("case", CASES)
def test_one_setting_moves_the_verdict_the_page_the_history_and_the_alert(case, tmp_path):
    setting, changed, make, readings, check, before, after, kind, alert = CASES[case]
    default = HealthSettings()
    moved = HealthSettings(**{setting: changed})
    for settings, state in ((default, before), (moved, after)):
        history = open_history(tmp_path / str(settings == default))
        snapshot, verdict = judge(settings, make, readings, history)
        result = next(c for c in verdict.gpus[GPU].checks if c.name == check)
        assert result.state == state, (case, settings, result)
        if kind is not None:
            page = [f["severity"] for f in findings(Published(snapshot, verdict))
                    if f["kind"] == kind and f["gpu"] == GPU]
            assert page in ([severity(state)], [] if state == "ok" else None), (case, page)
        if alert is not None:
            assert threshold_of(alert, settings) == getattr(settings, setting)
        # the history records the check's turn (an XID is an event, recorded either way:
        # what moves with the hold is the verdict's failed episode)
        episode = "health_failed" if check == "xid" else CHECK_KINDS[check]
        assert (episode in episode_kinds(history)) == (state != "ok"), (case, state)


def test_infiniband_setting_moves_the_node_verdict_the_history_and_the_alert(tmp_path):
    rate = 20.0  # symbol errors a second: above the default 10, below 30
    for settings, state in ((HealthSettings(), "warning"),
                            (HealthSettings(infiniband_symbol_errors_per_second=30.0), "ok")):
        monitor = HealthMonitor(settings)
        history = open_history(tmp_path / state)
        for t in (0.0, 100.0):
            snapshot = ib_snapshot(t, symbol_error=rate * t)
            verdict = monitor.assess(snapshot)
            history.observe(snapshot)
            history.observe_health(verdict)
        assert ("ib_degraded" in episode_kinds(history)) == (state == "warning")
        check = next(c for c in verdict.node.checks if c.name == "infiniband_link_errors")
        assert check.state == state
        assert threshold_of("InfinibandSymbolErrorRate", settings) == \
            settings.infiniband_symbol_errors_per_second


def threshold_of(alert: str, settings: HealthSettings) -> float:
    """The number in the alert's expression as the rules are written for `settings`."""
    threshold = next(t for t in THRESHOLDS if t.alert == alert)
    text = apply(threshold.file, (REPO / "alerts" / threshold.file).read_text(), settings)
    return float(threshold.find(text).group("n"))


def test_the_committed_rules_carry_the_defaults():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "build_health_rules.py"),
                             "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for threshold in THRESHOLDS:
        text = (REPO / "alerts" / threshold.file).read_text()
        assert float(threshold.find(text).group("n")) == pytest.approx(
            threshold.value(HealthSettings()), rel=1e-6), threshold


def test_an_operators_config_writes_rules_promtool_loads(tmp_path):
    promtool = require_binary("promtool")
    config = tmp_path / "config.yaml"
    config.write_text("health_retired_pages_max: 40\nhealth_pcie_replays_per_lane_per_minute: 0.3\n"
                      "health_infiniband_link_error_recovery_per_minute: 12\n")
    out = tmp_path / "rules"
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "build_health_rules.py"),
                             "--config", str(config), "--out-dir", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    hardware = (out / "gpu-hardware.yml").read_text()
    start, end = alert_block(hardware, "GpuRetiredPagesHigh")
    assert ">= 40\n" in hardware[start:end]
    start, end = alert_block(hardware, "GpuPcieReplaysHigh")
    assert "(0.96 * 2 ^" in hardware[start:end] and "or 0.3 * 2 ^" in hardware[start:end]
    fabric = (out / "fabric.yml").read_text()
    assert re.search(r"\* 60 > 12\n[\s\S]*\(threshold 12/min\)", fabric)
    # every other byte as committed
    committed = (REPO / "alerts" / "fabric.yml").read_text()
    assert len(fabric.splitlines()) == len(committed.splitlines())
    checked = subprocess.run([promtool, "check", "rules", *(str(out / f) for f in FILES)],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_bad_config_is_one_line_and_exit_2(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("health_retired_pages_max: lots\n")
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "build_health_rules.py"),
                             "--config", str(config), "--out-dir", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "health_retired_pages_max" in result.stderr
