"""The XID class table: every classified code in the code, the docs and the output.

The expected table is written out here, from NVIDIA's XID catalog (Ampere and newer,
by the immediate action it asks for), so a code dropped from both exporter/gpu/xid.py
and docs/metrics.md still fails.
"""

from __future__ import annotations

import re

import pytest

from exporter.gpu import xid
from exporter.gpu.xid import xid_class
from exporter.health.monitor import HealthMonitor, Published
from exporter.metrics.gpu_hardware import xid_families
from exporter.sampling.snapshot import XidRecord
from exporter.web.findings import findings
from tests.tools import REPO, judged, make_snapshot

NVLINK5 = range(144, 151)
EXPECTED = {
    "critical": {46, 48, 62, 64, 74, 79, 95, 109, 119, 120, 136, 140, 143, *NVLINK5, 155, 156,
                 158},
    # 154: its recovery action is read from NVML (gpu_recovery_action); 162-165: power smoothing
    "warning": {92, 94, 154, 157, 162, 163, 164, 165},
    "application": {13, 31, 43, 45, 63},
}
CLASSIFIED = sorted((code, cls) for cls, codes in EXPECTED.items() for code in codes)
UNCLASSIFIED = [0, 1, 8, 32, 61, 68, 93, 121, 137, 151, 153, 159, 161, 166, 999]
# The live page's severity of a code alone on a GPU: the verdict's state for it (failed ->
# critical, warning -> warning, ok -> info), written out here. Application XIDs that ask
# the application to restart (31, 43) and 63 (a remap waits for a reset) warn; 13 and 45
# are information; a code the table lacks warns, as the verdict does.
PAGE_INFO = {13, 45}
PAGE_CRITICAL = EXPECTED["critical"]


def codes(text: str) -> set[int]:
    """`46, 48, 144-150` -> {46, 48, 144, ..., 150}; words in parentheses are left out."""
    out: set[int] = set()
    for lo, hi in re.findall(r"\b(\d+)(?:-(\d+))?\b", re.sub(r"\([^)]*\)", "", text)):
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def documented_classes() -> dict[str, set[int]]:
    """The class list in docs/metrics.md, the paragraph after "XID classes"."""
    text = (REPO / "docs" / "metrics.md").read_text()
    para = text[text.index("XID classes (label `class`)"):]
    para = para[:para.index("\n\n")]
    found = {cls: codes(m) for cls, m in
             re.findall(r"`(critical|warning|application)` ([\d, \-]+?)[;,]?\s*(?=`|anything)",
                        para)}
    assert set(found) == set(EXPECTED), para
    assert "anything else\n`unknown`" in para or "anything else `unknown`" in para
    return found


def runbook_codes(alert: str, list_pattern: str) -> set[int]:
    """The codes listed in the "What it means" line of an alert's runbook section."""
    text = (REPO / "docs" / "runbooks.md").read_text()
    section = text[text.index(f"## {alert}\n"):]
    line = next(ln for ln in section.splitlines() if ln.startswith("**What it means.**"))
    m = re.search(list_pattern, line)
    assert m, line
    return codes(m.group(1))


def test_the_table_has_every_code_once() -> None:
    everything = [c for codes_ in EXPECTED.values() for c in codes_]
    assert len(everything) == len(set(everything)) == 36
    assert not set(UNCLASSIFIED) & set(everything)


@pytest.mark.parametrize(("code", "cls"), CLASSIFIED)
def test_every_classified_code(code: int, cls: str) -> None:
    assert xid_class(code) == cls


@pytest.mark.parametrize("code", UNCLASSIFIED)
def test_other_codes_are_unknown(code: int) -> None:
    assert xid_class(code) == "unknown"


def test_code_sets_are_the_table() -> None:
    assert EXPECTED["critical"] == xid.CRITICAL
    assert EXPECTED["warning"] == xid.WARNING
    assert EXPECTED["application"] == xid.APPLICATION


def test_docs_metrics_table_is_the_code_both_ways() -> None:
    docs = documented_classes()
    assert docs["critical"] == set(xid.CRITICAL)
    assert docs["warning"] == set(xid.WARNING)
    assert docs["application"] == set(xid.APPLICATION)


def test_runbooks_name_the_same_codes() -> None:
    # the alerts follow the xid check's state (the fault table), not the class
    failed = {c for c, row in xid.TABLE.items() if row.state == "failed"}
    warning = {c for c, row in xid.TABLE.items() if row.state == "warning"}
    assert runbook_codes("GpuXidCritical", r"catalog: ([^)]*)\)") == failed
    assert runbook_codes("GpuXidWarning", r"it warns on: (.*)$") == warning


def test_codes_parser() -> None:
    assert codes("46, 48 (DBE), 144-150; 9 (a 5 b)") == {46, 48, 9, *range(144, 151)}
    assert codes("none") == set()


def page_severity(code: int) -> str:
    return ("critical" if code in PAGE_CRITICAL else "info" if code in PAGE_INFO
            else "warning")


def test_every_code_reaches_the_metric_and_the_page_with_its_class() -> None:
    """The class label on gpu_xid_errors_total and the live page's severity, code by code,
    every code on one GPU: the verdict's xid check fails it, and each code's finding is
    that state, no more than its own row gives it."""
    now = 1_758_000_000.0
    all_codes = [c for c, _ in CLASSIFIED] + UNCLASSIFIED
    snap = make_snapshot(2, time=now, xids={(1, c): XidRecord(1, now - 5) for c in all_codes})
    family = next(f for f in xid_families(snap) if f.name == "gpu_xid_errors")
    rendered = {int(s.labels["xid"]): s.labels["class"] for s in family.samples
                if s.name == "gpu_xid_errors_total"}
    expected = dict(CLASSIFIED) | dict.fromkeys(UNCLASSIFIED, "unknown")
    assert rendered == expected
    page = {f["details"]["xid"]: f["severity"] for f in findings(judged(snap))
            if f["kind"] == "xid"}
    assert page == {c: page_severity(c) for c in expected}


@pytest.mark.parametrize("code", [c for c, _ in CLASSIFIED] + UNCLASSIFIED)
def test_the_page_says_what_the_verdict_says_code_by_code(code: int) -> None:
    """One judge: a code alone on GPU 1, judged by the health monitor; the page's finding
    takes the severity of the verdict's xid check, and ages with it."""
    now = 1_758_000_000.0
    for seen, severity in ((now - 5, page_severity(code)), (now - 86_400, "info")):
        snap = make_snapshot(2, time=now, xids={(1, code): XidRecord(1, seen)})
        verdict = HealthMonitor().assess(snap)
        state = next(c.state for c in verdict.gpus[1].checks if c.name == "xid")
        page = [f["severity"] for f in findings(Published(snap, verdict))
                if f["kind"] == "xid"]
        assert page == [severity], (code, state)
        assert severity == {"failed": "critical", "warning": "warning"}.get(state, "info")
