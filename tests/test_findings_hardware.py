"""The live page's hardware findings take the verdict's severity and words, and no
severity of their own: retired pages by the health check's limit, each finding at the
state of the check that judged it, information where nothing judged it."""

from __future__ import annotations

import pytest

from exporter.gpu.device_read import DeviceRead
from exporter.health.model import (
    ACTION_WORDS,
    FAILED,
    NOT_APPLICABLE,
    OK,
    RESET_GPU,
    UNKNOWN,
    WARNING,
    CheckResult,
    NodeHealth,
    unknown_health,
    verdict,
)
from exporter.web.findings_hardware import hardware_findings
from tests.tools import make_snapshot


def _reading(retired: float) -> DeviceRead:
    return DeviceRead(100.0, {}, {"single_bit": retired, "double_bit": 0.0}, 0.0, {}, None,
                     None, "none", ())


def _health(state: str, value: float, limit: float) -> NodeHealth:
    check = CheckResult("retired_pages", state, value, limit, "test", 0.0)
    return NodeHealth(100.0, verdict(()), {0: verdict((check,))})


def _retired(snapshot, health) -> list[str]:
    return [f["message"] for f in hardware_findings(snapshot, health)
            if f["kind"] == "retired_pages"]


def test_retired_pages_are_a_finding_at_the_health_checks_limit():
    below, at = (make_snapshot(1, time=100.0, device_reads={0: _reading(n)}) for n in (62.0, 63.0))
    # nothing judged: no limit of the page's own
    assert _retired(at, unknown_health(100.0, 1)) == []
    assert _retired(at, _health(FAILED, 63.0, 63.0)) == ["GPU 0 has 63 retired memory pages"]
    # the verdict judged with a lower limit (health_retired_pages_max: 20): the page follows
    assert _retired(below, _health(FAILED, 62.0, 20.0)) == ["GPU 0 has 62 retired memory pages"]
    assert _retired(at, _health(OK, 63.0, 100.0)) == []


def _fault_snapshot():
    """GPU 0 with an uncorrected ECC error, a failed row remap, the driver asking for a
    reset, a link down and CRC errors; GPU 1 hung; a GPU missing."""
    from dataclasses import replace

    from exporter.gpu.device_read import NvLink

    links = (NvLink(0, True, errors={"crc_flit": 12.0}), NvLink(1, False))
    reads = DeviceRead(100.0, {("uncorrected", "volatile"): 2.0}, {}, None, {}, 0.0, 1.0,
                      "gpu_reset", links)
    snap = make_snapshot(2, time=100.0, expected_gpus=3, hung={1: 90.0},
                         device_reads={0: reads})
    return replace(snap, identities=(replace(snap.identities[0], nvlinks=2),
                                     snap.identities[1]))


JUDGED = {"ecc": "ecc_uncorrected", "row_remap": "row_remap_failure",
          "recovery_action": "recovery_action", "gpu_hung": "gpu_answering"}


def _judging(state: str) -> NodeHealth:
    """Every check behind the fault snapshot's findings in `state`, asking for a reset
    where it is a problem."""
    action = RESET_GPU if state in (WARNING, FAILED) else "none"

    def check(name: str) -> CheckResult:
        return CheckResult(name, state, 1.0, 0.0, "test", 0.0, action, f"{name} says so")

    names = (*JUDGED.values(), "nvlink_links", "nvlink_errors")
    gpu = verdict(tuple(check(n) for n in names))
    return NodeHealth(100.0, verdict((check("gpu_count"),)), {0: gpu, 1: gpu})


SEVERITY = {FAILED: "critical", WARNING: "warning", OK: "info", UNKNOWN: "info",
            NOT_APPLICABLE: "info"}


@pytest.mark.parametrize("state", [FAILED, WARNING, OK, UNKNOWN, NOT_APPLICABLE])
def test_each_finding_takes_the_severity_and_words_of_its_check(state):
    """The same faults read critical, warning or information as the verdict's checks say,
    never by a severity of the page's own; the action is said in ACTION_WORDS' words."""
    found = hardware_findings(_fault_snapshot(), _judging(state))
    assert {f["kind"] for f in found} == {*JUDGED, "gpus_missing", "nvlink"}
    for f in found:
        assert f["severity"] == SEVERITY[state], f["kind"]
        said = f["details"]["verdict"]
        assert said["state"] == state
        if f["kind"] in JUDGED:
            assert said["check"] == JUDGED[f["kind"]]
        if state in (FAILED, WARNING):
            assert said["action"] == RESET_GPU
            assert said["action_words"] == ACTION_WORDS[RESET_GPU]
            assert f["kind"] == "recovery_action" or f["message"].endswith(
                ": " + ACTION_WORDS[RESET_GPU])
        else:
            assert not f["message"].endswith(ACTION_WORDS[RESET_GPU])
    recovery = next(f for f in found if f["kind"] == "recovery_action")
    assert recovery["message"] == "GPU 0: recovery_action says so"  # the verdict's reason


def test_nothing_judged_is_information_with_no_fallback():
    """Before the first judgement every hardware finding is information: no constant, XID
    table or slowdown table stands in for the verdict."""
    from exporter.gpu.reading import GpuReading
    from exporter.sampling.snapshot import XidRecord

    snap = make_snapshot(2, time=100.0, xids={(0, 79): XidRecord(1, 99.0)},
                         lost=frozenset({1}),
                         readings={0: GpuReading(99.0, {"clock_event_reasons": 0x40})})
    found = hardware_findings(snap, unknown_health(100.0, 2))
    assert {f["kind"] for f in found} == {"xid", "gpu_lost", "clock_event"}
    assert {f["severity"] for f in found} == {"info"}
    assert {f["details"]["verdict"]["state"] for f in found} == {UNKNOWN}


def _nvlink_judged(errors: str, replays: str) -> NodeHealth:
    def check(name: str, state: str) -> CheckResult:
        action = RESET_GPU if state == FAILED else "none"
        return CheckResult(name, state, 3.0, 1.0, "test", 0.0, action, f"{name} says so")

    gpu = verdict((check("nvlink_errors", errors), check("nvlink_replays", replays)))
    return NodeHealth(100.0, verdict(()), {0: gpu})


@pytest.mark.parametrize(("errors", "replays", "severity", "by"), [
    (OK, FAILED, "critical", "nvlink_replays"),
    (WARNING, OK, "warning", "nvlink_errors"),
    (FAILED, FAILED, "critical", "nvlink_errors"),  # equals: the verdict's first
    (OK, OK, "info", "nvlink_errors"),
])
def test_the_nvlink_finding_takes_the_worse_of_crc_and_replay_errors(errors, replays,
                                                                      severity, by):
    """Replay and recovery errors are their own check (nvlink_replays): the NVLink
    finding reads at the worse of it and the CRC check, and says which judged it."""
    from exporter.gpu.device_read import NvLink

    links = (NvLink(0, True, errors={"replay": 3.0, "crc_flit": 0.0}),)
    reads = DeviceRead(100.0, {}, {}, None, {}, 0.0, 0.0, "none", links)
    snap = make_snapshot(1, time=100.0, device_reads={0: reads})
    [found] = [f for f in hardware_findings(snap, _nvlink_judged(errors, replays))
               if f["kind"] == "nvlink"]
    assert found["severity"] == severity
    assert found["details"]["verdict"]["check"] == by
    assert found["details"]["errors"] == {"replay": 3.0}
    if severity == "critical":
        assert found["message"].startswith(f"GPU 0: {by} says so (3 against 1); ")
        assert found["message"].endswith(": " + ACTION_WORDS[RESET_GPU])


def _xid_found(code: int) -> dict:
    """The XID finding of `code` on GPU 0, whose `xid` check failed (on another code)."""
    from exporter.sampling.snapshot import XidRecord

    failed = CheckResult("xid", FAILED, 79.0, None, "test", 0.0, RESET_GPU, "XID 79")
    snap = make_snapshot(1, time=100.0, xids={(0, code): XidRecord(1, 99.0)})
    [found] = hardware_findings(snap, NodeHealth(100.0, verdict(()), {0: verdict((failed,))}))
    return found


def test_an_xid_finding_reads_the_fault_tables_judgement_of_its_code():
    """The page reads an XID as the verdict and the alerts do, through the fault table's
    xid_judgement, never above its severity; no other reading of an XID's state."""
    import ast

    from exporter.gpu.xid import TABLE
    from exporter.health.faults import xid_judgement
    from tests.tools import REPO

    for code in (*sorted(TABLE), 9999):
        assert _xid_found(code)["severity"] == xid_judgement(code).severity, code
    for path in sorted((REPO / "exporter" / "web").glob("*.py")):
        tree = ast.parse(path.read_text())
        read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert "xid_row" not in read, path.name
