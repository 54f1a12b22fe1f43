"""The live page's hardware findings judge retired pages by the health check's limit."""

from __future__ import annotations

from exporter.gpu.health import GpuHealth
from exporter.health.model import FAILED, OK, CheckResult, NodeHealth, verdict
from exporter.web.findings_hardware import hardware_findings
from tests.tools import make_snapshot


def _reading(retired: float) -> GpuHealth:
    return GpuHealth(100.0, {}, {"single_bit": retired, "double_bit": 0.0}, 0.0, {}, None,
                     None, "none", ())


def _health(state: str, value: float, limit: float) -> NodeHealth:
    check = CheckResult("retired_pages", state, value, limit, "test", 0.0)
    return NodeHealth(100.0, verdict(()), {0: verdict((check,))})


def _retired(snapshot, health=None) -> list[str]:
    return [f["message"] for f in hardware_findings(snapshot, health)
            if f["kind"] == "retired_pages"]


def test_retired_pages_are_a_finding_at_the_health_checks_limit():
    below, at = (make_snapshot(1, time=100.0, device_reads={0: _reading(n)}) for n in (62.0, 63.0))
    # no verdict: the setting's default (63)
    assert _retired(below) == []
    assert _retired(at) == ["GPU 0 has 63 retired memory pages"]
    # the verdict judged with a lower limit (health_retired_pages_max: 20): the page follows
    assert _retired(below, _health(FAILED, 62.0, 20.0)) == ["GPU 0 has 62 retired memory pages"]
    assert _retired(at, _health(OK, 63.0, 100.0)) == []
