"""alerts/: promtool check and unit tests; every alert documented, tested and runbooked."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from tests.tools import REPO, require_binary

ALERTS = REPO / "alerts"
RULE_FILES = sorted(ALERTS.glob("*.yml"))
TEST_FILES = sorted((ALERTS / "tests").glob("*.test.yml"))
RUNBOOKS = REPO / "docs" / "runbooks.md"
METRICS_DOC = REPO / "docs" / "metrics.md"
SEVERITIES = {"critical", "warning", "info"}
# Metric-name prefixes the exporter owns: every such name in a rule must be documented.
OWN_PREFIXES = ("gpu_", "power_", "infiniband_", "cte_", "collective_", "straggler_", "host_")
LABELS = {"gpu_instance"}  # label names that start like our families


def _rules() -> list[dict]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                out.append(rule | {"_file": path.name})
    return out


def _alerts() -> list[dict]:
    return [r for r in _rules() if "alert" in r]


def test_promtool_check_rules():
    promtool = require_binary("promtool")
    result = subprocess.run([promtool, "check", "rules", *map(str, RULE_FILES)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests():
    promtool = require_binary("promtool")
    result = subprocess.run([promtool, "test", "rules", *map(str, TEST_FILES)],
                            capture_output=True, text=True, timeout=300, cwd=ALERTS / "tests")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_labels_and_annotations():
    alerts = _alerts()
    assert len(alerts) >= 30
    names = [a["alert"] for a in alerts]
    assert len(names) == len(set(names)), "duplicate alert names"
    for alert in alerts:
        # one word, or (an alert on several states of a check) the state's, by template
        word = alert.get("labels", {}).get("severity", "")
        chosen = re.sub(r'\{\{ (if eq \$labels\.state "\w+"|else|end) \}\}', " ", word).split()
        assert chosen and set(chosen) <= SEVERITIES, alert["alert"]
        annotations = alert.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            assert annotations.get(key), f"{alert['alert']}: no {key}"
        assert "$labels.instance" in annotations["summary"] + annotations["description"] or (
            "$labels.cluster" in annotations["summary"]), alert["alert"]


def _anchors(markdown: str) -> set[str]:
    anchors = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return anchors


def test_every_runbook_url_has_a_section():
    anchors = _anchors(RUNBOOKS.read_text())
    for alert in _alerts():
        url = alert["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page.endswith("docs/runbooks.md"), url
        assert anchor == alert["alert"].lower(), url
        assert anchor in anchors, f"{alert['alert']}: no section #{anchor} in docs/runbooks.md"


def test_every_alert_is_in_the_alerts_doc():
    text = (REPO / "docs" / "alerts.md").read_text()
    for alert in _alerts():
        assert f"[`{alert['alert']}`]" in text, alert["alert"]


def test_every_alert_fires_and_has_a_near_miss_in_the_unit_tests():
    fires, misses = set(), set()
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else misses).add(check["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names - fires == set(), "alerts never shown firing"
    assert names - misses == set(), "alerts without a near miss"


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r.get("alert") or r["record"])
def test_rules_use_documented_metrics(rule):
    documented = set(re.findall(r"^\| `([a-z0-9_:]+)` \|", METRICS_DOC.read_text(), re.M))
    recorded = {r["record"] for r in _rules() if "record" in r}
    expr = re.sub(r'"[^"]*"', '""', rule["expr"])  # label values are no metric names
    for name in re.findall(r"\b[a-z_][a-z0-9_:]*\b", expr):
        if name in LABELS:
            continue
        if name.startswith(OWN_PREFIXES) and ":" not in name:
            assert name in documented, f"{name} is not in docs/metrics.md"
        elif ":" in name:
            assert name in recorded, f"{name} is not recorded by any rule"


# What the health checks read: an alert on these would judge a second time, with
# thresholds of its own (exporter/health/faults.py writes the hardware and fabric alerts
# from the verdict's check states instead).
JUDGED_BY_CHECKS = re.compile(
    r"\b(gpu_xid_errors_total|gpu_ecc_errors_total|gpu_retired_pages_total|gpu_row_remap_\w+"
    r"|gpu_remapped_rows_total|gpu_up|gpu_nvlink_errors_total|gpu_nvlink_links_\w+"
    r"|gpu_pcie_\w+|gpu_clock_event_active|gpu_recovery_action|gpu_expected_devices"
    r"|infiniband_port_\w+_total|infiniband_port_state_id)\b")
# not a check's judgement: the port against its peers and its own last day (ACTIVE ports
# only, the state read as a filter)
NOT_A_CHECK = {"InfinibandPortRateDegraded"}


def test_no_alert_judges_what_a_health_check_judges():
    for alert in _alerts():
        if alert["alert"] in NOT_A_CHECK:
            continue
        expr = re.sub(r'"[^"]*"', '""', alert["expr"])
        assert not JUDGED_BY_CHECKS.search(expr), (alert["alert"], alert["expr"])


def test_recording_rule_names_the_dashboards_use():
    recorded = {r["record"] for r in _rules() if "record" in r}
    for scope in ("hpc_job", "cluster"):
        for name in ("gpu_power_watts:sum", "power_swing_amplitude_watts:sum",
                     "power_swing_phase_coherence:ratio",
                     "power_swing_coherent_amplitude_watts:estimate",
                     "power_ramp_watts_per_second:sum"):
            assert f"{scope}:{name}" in recorded
    assert {"cluster:gpus_up:sum", "cluster:gpus_expected:sum"} <= recorded
