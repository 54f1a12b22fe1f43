"""One judge: for every check with a threshold, the setting changed in one place moves the
verdict, the API's and the page's reading, the history's episode and the alert together.
The alert moves by construction: every GPU-hardware and fabric rule is written from the
fault table (exporter/health/faults.py) and reads the check's state from the verdict's
families, with no threshold of its own; the committed rule files are what the table writes.
An XID means one thing to the verdict, the alerts and the lemon score."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from exporter.analysis.lemons import HARDWARE_XID_ACTIONS, counted
from exporter.gpu import xid as catalog
from exporter.gpu.device_read import NvLink
from exporter.gpu.reading import GpuReading
from exporter.health.faults import FAULTS, GPU, PORT, fault, severity, xid_judgement
from exporter.health.monitor import GPU_CHECKS, NODE_CHECKS, PORT_CHECKS, HealthMonitor, Published
from exporter.health.rules import FAMILY, rule_files
from exporter.health.settings import HealthSettings
from exporter.history.recorder import CHECK_KINDS
from exporter.sampling.snapshot import XidRecord
from exporter.web.api import health_body
from exporter.web.findings import findings
from tests.test_health_infiniband import ib_snapshot
from tests.test_health_verdict import LINK, device_read, snap
from tests.test_history_store import history as open_history
from tests.tools import REPO

GPU_INDEX = 1


def _gpu_device_read(t: float, **fields):
    return snap(t, device_reads={g: device_read(t, **(fields if g == GPU_INDEX else {}))
                           for g in range(2)})


def _gpu_reading(t: float, **values):
    return snap(t, readings={g: GpuReading(t, {**LINK, **(values if g == GPU_INDEX else {})})
                           for g in range(2)})


def nvlink(kind: str):
    def make(t: float, count: float):
        errors = {"crc_flit": 0.0, "replay": 0.0, kind: count}
        return _gpu_device_read(t, nvlinks=(NvLink(0, True, errors=errors),))
    return make


def retired(t: float, pages: float):
    return _gpu_device_read(t, retired_pages={"single_bit": pages})


def retired_dbe(t: float, pages: float):
    return _gpu_device_read(t, retired_pages={"double_bit": pages})


def remapped(t: float, rows: float):
    return _gpu_device_read(t, remapped_rows={"uncorrectable": rows})


def pcie_replays(t: float, replays: float):
    return _gpu_reading(t, pcie_replays=replays)


def pcie_gen4(t: float, _: float):
    return _gpu_reading(t, pcie_generation=4.0)


def pcie_x8(t: float, _: float):
    return _gpu_reading(t, pcie_width=8.0)


def xid_hours_ago(t: float, hours: float):
    return snap(t, xids={(GPU_INDEX, 48): XidRecord(1, t - hours * 3600)})


def ib(counter: str):
    def make(t: float, value: float):
        return ib_snapshot(t, **{counter: value})
    return make


# check: setting, changed value, snapshots (t, value), state with the default and with the
# change, the page's finding kind (None: the verdict panel alone)
CASES = {
    "xid": ("xid_hold_seconds", 3600.0, xid_hours_ago, [(10_000, 1.5)], "failed", "ok",
            "xid"),
    "retired_pages": ("retired_pages_max", 32.0, retired, [(0, 40.0)], "ok", "failed",
                      "retired_pages"),
    "retired_pages_recent": ("retired_dbe_pages_max", 25.0, retired_dbe,
                             [(0, 10.0), (60, 20.0)], "failed", "ok", None),
    "retired_pages_recent/new": ("retired_dbe_new_pages_per_week", 20.0, retired_dbe,
                                 [(0, 10.0), (60, 20.0)], "failed", "ok", None),
    "remapped_rows": ("remapped_rows_uncorrectable_max", 1000.0, remapped, [(0, 600.0)],
                      "warning", "ok", None),
    "pcie_replays": ("pcie_replays_per_lane_per_minute", 0.05, pcie_replays,
                     [(0, 0.0), (60, 20.0)], "ok", "warning", None),
    "pcie_link": ("pcie_load_ratio", 0.95, pcie_gen4, [(0, 0.0)], "warning", "ok", None),
    "pcie_link_width": ("pcie_load_ratio", 0.95, pcie_x8, [(0, 0.0)], "warning", "ok",
                        None),
    "nvlink_replays": ("nvlink_replays_per_minute", 5.0, nvlink("replay"),
                       [(0, 0.0), (60, 3.0)], "failed", "ok", "nvlink"),
    "nvlink_errors": ("nvlink_crc_per_minute", 60.0, nvlink("crc_flit"),
                      [(0, 0.0), (60, 30.0)], "warning", "ok", "nvlink"),
    "nvlink_errors/second": ("nvlink_crc_per_second", 200.0, nvlink("crc_flit"),
                             [(0, 0.0), (60, 9000.0)], "failed", "warning", "nvlink"),
    "infiniband_symbol_errors": ("infiniband_symbol_errors_per_second", 30.0,
                                 ib("symbol_error"), [(0, 0.0), (100, 2000.0)], "warning",
                                 "ok", None),
    "infiniband_link_error_recovery": ("infiniband_link_error_recovery_per_minute", 12.0,
                                       ib("link_error_recovery"), [(0, 0.0), (100, 16.0)],
                                       "warning", "ok", None),
}
# a window, not a threshold: the rate checks' shared minute (tested with the checks)
WINDOWS = {"window_seconds"}


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


def rules() -> dict[str, dict]:
    return {r["alert"]: r for text in rule_files().values()
            for group in yaml.safe_load(text)["groups"] for r in group["rules"]}


def test_every_threshold_setting_of_every_check_has_a_case():
    covered = {(case.split("/")[0], setting) for case, (setting, *_) in CASES.items()}
    wanted = {(f.check, s) for f in FAULTS for s in f.settings if s not in WINDOWS}
    assert wanted - covered == set()


@pytest.mark.parametrize("case", CASES)
def test_one_setting_moves_the_verdict_the_api_the_page_the_history_and_the_alert(
        case, tmp_path):
    setting, changed, make, readings, before, after, kind = CASES[case]
    name = case.split("/")[0]
    row = next(f for f in FAULTS if f.check == name)
    by_rule = rules()
    for settings, state in ((HealthSettings(), before),
                            (HealthSettings(**{setting: changed}), after)):
        history = open_history(tmp_path / str(settings == HealthSettings()))
        snapshot, verdict = judge(settings, make, readings, history)
        body = json.loads(health_body(verdict))
        if row.scope == GPU:
            result = next(c for c in verdict.gpus[GPU_INDEX].checks if c.name == name)
            api = {c["state"] for c in body["gpus"][str(GPU_INDEX)]["checks"]
                   if c["name"] == name}
        else:
            result = next(c for c in verdict.node.checks
                          if c.name == name and c.port == "mlx5_0/1")
            api = {c["state"] for c in body["node"]["checks"] if c["name"] == name}
        assert result.state == state, (case, settings, result)
        assert state in api
        assert result.action == row.action(state, result.action)
        if kind is not None:
            page = [f["severity"] for f in findings(Published(snapshot, verdict))
                    if f["kind"] == kind and f["gpu"] == GPU_INDEX]
            assert page in ([severity(state)], [] if state == "ok" else None), (case, page)
        # the history records the check's turn (an XID is an event, recorded either way:
        # what moves with the hold is the verdict's failed episode)
        episode = "health_failed" if name == "xid" else CHECK_KINDS[name]
        assert (episode in episode_kinds(history)) == (state in ("warning", "failed"))
        # the alerts on this check fire on its state, whatever the setting: each rule
        # reads the verdict's state for the check and holds no threshold
        for alert in row.alerts:
            expr = by_rule[alert.name]["expr"]
            assert expr.startswith(f'{FAMILY[row.scope]}{{check="{name}", state=')
            assert re.findall(r"\d+(?:\.\d+)?", expr) == ["1"], expr
        firing = {a.name for a in row.alerts if state in a.states}
        assert all(state in by_rule[a]["expr"] for a in firing)


def test_every_check_has_a_row_and_every_row_a_check():
    judged = ({(GPU, c.name) for c in GPU_CHECKS} | {("node", c.name) for c in NODE_CHECKS}
              | {(PORT, c.name) for c in PORT_CHECKS})
    assert judged == {(f.scope, f.check) for f in FAULTS}
    for f in FAULTS:
        assert fault(f.scope, f.check) is f
        assert CHECK_KINDS.get(f.check) == f.episode or f.episode is None
        assert all(hasattr(HealthSettings(), s) for s in f.settings)


def test_the_hardware_and_fabric_rules_read_the_verdict_and_no_counter():
    for text in rule_files().values():
        for group in yaml.safe_load(text)["groups"]:
            for rule in group["rules"]:
                metrics = set(re.findall(r"\b(gpu_[a-z_]+|infiniband_[a-z_]+)\b",
                                         re.sub(r'"[^"]*"', "", rule["expr"])))
                assert metrics <= {"gpu_health_check_state", "gpu_node_health_check_state",
                                   "gpu_health_state", "gpu_health_action"}, rule["alert"]
                assert re.findall(r"\d+(?:\.\d+)?", rule["expr"]) == ["1"], rule["alert"]


def test_the_committed_rules_and_tests_are_what_the_table_writes():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "build_health_rules.py"),
                             "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for name, text in rule_files().items():
        assert (REPO / "alerts" / name).read_text() == text


def test_a_stale_rule_file_is_named_and_exit_1(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import build_health_rules as script
    finally:
        sys.path.remove(str(REPO / "scripts"))
    target = tmp_path / "gpu-hardware.yml"
    target.write_text("groups: []\n")
    monkeypatch.setattr(script, "written", lambda: {target: "groups:\n  - name: x\n"})
    monkeypatch.setattr(script, "REPO", tmp_path)
    assert script.main(["--check"]) == 1
    assert target.read_text() == "groups: []\n"  # --check writes nothing


@pytest.mark.parametrize("code", [*sorted(catalog.TABLE), 9999])
def test_an_xid_means_one_thing_to_the_verdict_the_alerts_and_the_lemon_score(code):
    judged = xid_judgement(code)
    row = catalog.xid_row(code)
    assert (judged.state, judged.action) == (row.state, row.action)
    verdict = HealthMonitor().assess(snap(10.0, xids={(GPU_INDEX, code): XidRecord(1, 9.0)}))
    result = next(c for c in verdict.gpus[GPU_INDEX].checks if c.name == "xid")
    assert result.state == judged.state
    if judged.state != "ok":
        assert result.action == judged.action
    alerts = {a.name for a in fault(GPU, "xid").alerts if judged.state in a.states}
    assert alerts == {"failed": {"GpuXidCritical"}, "warning": {"GpuXidWarning"},
                      "ok": set()}[judged.state]
    assert counted("xid", code) == judged.lemon
    # the node-local lemon rules select XID episodes by action: the same XIDs
    assert judged.lemon == (judged.action in HARDWARE_XID_ACTIONS)


def test_xid_63_warns_the_verdict_and_fires_the_warning_alert():
    judged = xid_judgement(63)
    assert (judged.state, judged.severity) == ("warning", "warning")
    assert "GpuXidWarning" in {a.name for a in fault(GPU, "xid").alerts
                               if "warning" in a.states}


def test_the_recovery_actions_alert_has_the_verdicts_severity():
    rule = rules()["GpuRecoveryActionRequired"]
    assert 'state=~"warning|failed"' in rule["expr"]
    assert rule["labels"]["severity"] == (
        '{{ if eq $labels.state "warning" }}warning{{ else }}critical{{ end }}')
    for action, state in (("drain_p2p", "warning"), ("gpu_reset", "failed")):
        verdict = HealthMonitor().assess(_gpu_device_read(10.0, recovery_action=action))
        result = next(c for c in verdict.gpus[GPU_INDEX].checks
                      if c.name == "recovery_action")
        assert result.state == state


def test_a_check_the_table_lacks_is_refused_by_name():
    with pytest.raises(KeyError, match="no fault table row for the gpu check nope"):
        fault(GPU, "nope")
    # the port checks are the node's too; a GPU check is not
    assert fault("node", "infiniband_ports").scope == PORT
    with pytest.raises(KeyError):
        fault(GPU, "infiniband_ports")
