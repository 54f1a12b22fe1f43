"""Findings in words (exporter/web/findings.py) on hand-made snapshots: each kind, its
severity, the GPU it names, its times, and a sentence a person on call understands."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from exporter.analysis.power_swing import CycleFeatures, NodeSwing, Ramp, SwingFeatures
from exporter.analysis.stalls import StallResult
from exporter.analysis.step_segments import SegmentAnalysis, StepSwing
from exporter.analysis.straggler import (
    GpuFeatures,
    GpuStraggler,
    SignalScore,
    StragglerReport,
    WindowFeatures,
    window_features,
)
from exporter.gpu.device_read import DeviceRead, NvLink
from exporter.gpu.fields import CLOCK_EVENT_REASONS
from exporter.gpu.reading import GpuReading
from exporter.health.model import OK, WARNING, CheckResult, NodeHealth, verdict
from exporter.health.monitor import Published
from exporter.sampling.live_power import PowerAnalysis
from exporter.sampling.live_stragglers import StragglerAnalysis
from exporter.sampling.snapshot import XidRecord
from exporter.web import findings as page
from exporter.web.wording import duration, gpu_list
from tests.tools import judged, make_snapshot


def findings(snapshot, health: NodeHealth | None = None) -> list[dict]:
    """The findings of the snapshot published with `health`, else with its own verdict
    (the one judge, as the app publishes it)."""
    return page.findings(Published(snapshot, health) if health is not None
                         else judged(snapshot))


def checks_say(gpus: int, said: dict[int, dict[str, str]]) -> NodeHealth:
    """A verdict in which each GPU's named checks are in the given states."""
    out = {g: verdict(tuple(CheckResult(name, state, None, None, "test", 0.0)
                            for name, state in said.get(g, {}).items()))
           for g in range(gpus)}
    return NodeHealth(NOW, verdict(()), out)

NOW = 1_700_000_000.0


def _swing_features(amplitude: float, ratio: float | None, hz: float | None,
                    duty: float = 0.6) -> SwingFeatures:
    return SwingFeatures(3000.0, amplitude, ratio, hz, 0.9, 0.9, 20000.0, duty, 0.1)


def _power(swinging: bool = True, cycle: CycleFeatures | None = None,
           ramp: Ramp | None = None) -> PowerAnalysis:
    swing = NodeSwing(_swing_features(3980.0, 0.71, 0.45), {}, 0.96, (0.0, 25.0), 50.0, 30.0,
                      NOW - 10, True)
    return PowerAnalysis(NOW - 2, 30.0, swing, swinging, cycle, {"rise": 1, "fall": 0}, ramp)


def _score(value: float, median: float, direction: str | None, since: float | None,
           finding: bool) -> SignalScore:
    return SignalScore(value, median, 8.0 if direction == "high" else -8.0, direction is not None,
                       direction, since, finding)


def _straggler_report(gpus: int, straggler: int, since: float, group: str = "") -> StragglerReport:
    out = {}
    for g in range(gpus):
        if g == straggler:
            scores = {"sm_clock": _score(1.66e9, 1.95e9, "low", since, True),
                      "temperature": _score(64.0, 55.0, "high", since, True),
                      "throttle": _score(1.0, 0.2, "high", since, True)}
            out[g] = GpuStraggler(g, group, True, None, True,
                                  ("sm_clock", "temperature", "throttle"), since, scores)
        else:
            scores = {"sm_clock": _score(1.95e9, 1.95e9, None, None, False)}
            out[g] = GpuStraggler(g, group, True, None, False, (), None, scores)
    return StragglerReport(NOW - 5, out, (), (), True, None)


def _stragglers(gpus: int = 8, straggler: int = 5, since: float = NOW - 360,
                stall: StallResult | None = None, features: WindowFeatures | None = None,
                group: str = "") -> StragglerAnalysis:
    return StragglerAnalysis(NOW - 1, features, _straggler_report(gpus, straggler, since, group),
                             stall, 1 if stall else 0, 3.0, {3: 3.0} if stall else {})


def _kinds(found: list[dict]) -> list[tuple[str, str, int | None]]:
    return [(f["kind"], f["severity"], f["gpu"]) for f in found]


def test_a_straggler_is_named_with_its_signal_and_how_long():
    snap = make_snapshot(8, time=NOW, straggler_analysis=_stragglers())
    found = findings(snap)
    assert _kinds(found) == [("straggler", "warning", 5)]
    f = found[0]
    assert f["message"].startswith(
        "GPU 5 is a straggler: SM clock 15 % below its peers for 6 min (also: ")
    assert "9 °C hotter than peers" in f["message"]
    assert "throttled 100 % of the time against 20 % for peers" in f["message"]
    assert f["since"] == NOW - 360 and f["time"] == NOW - 5
    assert set(f["details"]["signals"]) == {"sm_clock", "temperature", "throttle"}
    assert f["details"]["signals"]["sm_clock"]["direction"] == "low"


def test_peers_in_a_job_are_named():
    snap = make_snapshot(8, time=NOW, straggler_analysis=_stragglers(group="job-42"))
    assert "below its peers in job job-42 for" in findings(snap)[0]["message"]


def test_a_stall_names_its_culprit_before_everything_else():
    stall = StallResult(True, (0, 1, 2, 4, 5, 6, 7), (3,), ("",))
    snap = make_snapshot(8, time=NOW, straggler_analysis=_stragglers(stall=stall))
    found = findings(snap)
    assert _kinds(found)[0] == ("stall", "critical", 3)
    assert found[0]["message"].startswith(
        "GPU 3 holds up the others: GPUs 0-2, 4-7 wait in a collective")
    assert found[0]["details"]["waiting_gpus"] == [0, 1, 2, 4, 5, 6, 7]


def test_power_swing_cycle_and_ramp():
    cycle = CycleFeatures(22.4, 1 / 22.4, 0.66, 378.0, 0.07, {}, 0.74, 0.95, 3346.0)
    ramp = Ramp(NOW - 30, "fall", -2140.0, 0.89)
    snap = make_snapshot(8, time=NOW, power_analysis=_power(True, cycle, ramp))
    found = findings(snap)
    # information, as the node's power alerts are: a healthy training node swings
    assert _kinds(found) == [("power_swing", "info", None), ("power_cycle", "info", None),
                             ("ramp", "info", None)]
    swing, cyc, rmp = found
    assert swing["message"] == (
        "Node power swings 3,980 W (71 % of the power limits) at 0.45 Hz (every 2.2 s), "
        "all GPUs in step (synchrony 0.96), high 60 % of the time")
    assert swing["details"]["frequency_hz"] == 0.45 and swing["details"]["synchrony"] == 0.96
    assert cyc["message"].startswith("Node power cycles every 22.4 s: 378 W deep (7 % of")
    assert rmp["message"] == "Node power fell 2,140 W in 0.89 s to a level that held"
    assert rmp["time"] == NOW - 30 and rmp["details"]["direction"] == "fall"


def test_the_step_period_is_a_finding_whatever_its_size():
    step = StepSwing(2.4, 28.0, 0.02, 1900.0, 0.97, 150.0, 1.0, 0.93, 0.3, NOW - 5, 5, 80.0, None)
    small = dataclasses.replace(_power(False), step=SegmentAnalysis(step, (), 40.0))
    found = findings(make_snapshot(8, time=NOW, power_analysis=small))
    assert _kinds(found) == [("step_period", "info", None)]
    assert found[0]["message"] == (
        "Step period 417 ms (2.40 Hz) from the compute phases' power: a 28 W swing (2 % of "
        "the power limits), all GPUs in step (synchrony 0.97), in 93 % of compute")
    assert found[0]["details"]["grid_relevant"] is False
    assert found[0]["details"]["period_seconds"] == round(1 / 2.4, 6)
    # past the amplitude threshold still information: the site's limit is the cluster's
    # (ClusterPowerSwingCoherent), which one node cannot judge
    big = dataclasses.replace(small, step_grid_relevant=True)
    found = findings(make_snapshot(8, time=NOW, power_analysis=big))
    assert _kinds(found) == [("step_period", "info", None)]
    assert found[0]["details"]["grid_relevant"] is True
    both = dataclasses.replace(big, swinging=True)
    found = findings(make_snapshot(8, time=NOW, power_analysis=both))
    assert _kinds(found) == [("power_swing", "info", None), ("step_period", "info", None)]


def test_no_swing_finding_until_the_detector_holds_and_old_ramps_are_history():
    old_ramp = Ramp(NOW - 3600, "rise", 2000.0, 1.0)
    snap = make_snapshot(8, time=NOW, power_analysis=_power(False, None, old_ramp))
    assert findings(snap) == []


def test_hardware_faults_each_with_gpu_severity_and_time():
    links = (NvLink(0, True, errors={"replay": 0.0, "crc_flit": 12.0}), NvLink(1, False))
    health = {1: DeviceRead(NOW - 3, {("uncorrected", "volatile"): 2.0}, {}, None, {}, 1.0, 0.0,
                           "gpu_reset", links)}
    snap = make_snapshot(
        4, time=NOW, expected_gpus=5, lost=frozenset({2}), hung={3: NOW - 20.0},
        xids={(0, 79): XidRecord(1, NOW - 65), (0, 13): XidRecord(4, NOW - 10)},
        device_reads=health)
    found = findings(snap)
    kinds = _kinds(found)
    assert ("gpu_hung", "critical", 3) in kinds
    assert ("gpu_lost", "critical", 2) in kinds
    assert ("gpus_missing", "critical", None) in kinds
    assert ("xid", "critical", 0) in kinds and ("xid", "info", 0) in kinds
    assert ("ecc", "critical", 1) in kinds and ("recovery_action", "critical", 1) in kinds
    assert ("row_remap", "warning", 1) in kinds
    assert ("nvlink", "info", 1) in kinds  # error totals: rates are Prometheus' job
    by_kind = {f["kind"]: f for f in found}
    assert by_kind["gpu_hung"]["message"].startswith("GPU 3 is stuck in an NVML call for 20 s")
    assert by_kind["gpu_hung"]["since"] == NOW - 20
    xid79 = next(f for f in found if f["kind"] == "xid" and f["details"]["xid"] == 79)
    # the verdict's action, in its words, ends what it judged
    assert xid79["message"] == ("GPU 0: XID 79 (GPU has fallen off the bus), critical, once, "
                                "last 65 s ago: reboot the node")
    assert xid79["time"] == NOW - 65
    assert by_kind["gpus_missing"]["message"] == "4 GPUs present, 5 expected: reboot the node"
    assert by_kind["ecc"]["time"] == NOW - 3
    assert by_kind["ecc"]["message"] == ("GPU 1 has 2 uncorrected ECC errors since the driver "
                                         "loaded: reset the GPU")
    assert by_kind["ecc"]["details"]["verdict"] == {
        "check": "ecc_uncorrected", "state": "failed", "action": "reset_gpu",
        "action_words": "reset the GPU", "reason": "uncorrectable ECC errors"}
    assert [f["severity"] for f in found] == sorted(
        (f["severity"] for f in found), key=["critical", "warning", "info"].index)


def test_nvlink_down_is_critical():
    from dataclasses import replace

    snap = make_snapshot(2, time=NOW, device_reads={
        0: DeviceRead(NOW, {}, {}, None, {}, None, None, None,
                      (NvLink(0, True), NvLink(1, False)))})
    ids = (replace(snap.identities[0], nvlinks=2), snap.identities[1])
    found = findings(replace(snap, identities=ids))
    assert _kinds(found) == [("nvlink", "critical", 0)]
    assert found[0]["message"] == "GPU 0: 1 of 2 NVLinks down (links 1): reset the GPU"


def _window(gpu_reasons: dict[int, dict[str, float]]) -> WindowFeatures:
    gpus = {g: GpuFeatures(g, 1.9e9, 500.0, 60.0, 1.0, 0.5, max(r.values(), default=0.0), r,
                           float("nan"), float("nan")) for g, r in gpu_reasons.items()}
    return WindowFeatures(NOW - 60, NOW, gpus, 100.0, 700.0, True)


def test_clock_events_hardware_slowdowns_warn_and_a_brief_power_cap_is_normal():
    states = {0: GpuReading(NOW - 1, {"clock_event_reasons": 0x40}),  # HW thermal, now
              1: GpuReading(NOW - 1, {"clock_event_reasons": 0x4}),  # power cap, briefly
              2: GpuReading(NOW - 1, {"clock_event_reasons": 0x4})}  # power cap, most of it
    window = _window({0: {"hw_thermal_slowdown": 1.0}, 1: {"sw_power_cap": 0.2},
                      2: {"sw_power_cap": 0.9}})
    analysis = StragglerAnalysis(NOW, window, None, None)
    snap = make_snapshot(3, time=NOW, readings=states, straggler_analysis=analysis,
                         clock_event_seconds={(0, "hw_thermal_slowdown"): 360.0})
    found = findings(snap, checks_say(3, {0: {"thermal_violation": WARNING}}))
    assert _kinds(found) == [("clock_event", "warning", 0), ("clock_event", "info", 2)]
    assert found[0]["message"] == ("GPU 0 clocks held down by HW thermal slowdown (active now; "
                                   "100 % of the last 60 s; 6 min in all)")
    assert found[1]["message"].startswith("GPU 2 clocks held down by its power cap (active now; "
                                          "90 % of the last 60 s")
    assert found[0]["details"]["reasons"] == {"hw_thermal_slowdown": {
        "active": True, "window_share": 1.0, "seconds_total": 360.0}}


def test_reasons_that_come_together_share_one_finding():
    """A power brake is also an HW slowdown: one finding for the GPU, not two."""
    states = {0: GpuReading(NOW - 1, {"clock_event_reasons": 0x0})}
    window = _window({0: {"hw_slowdown": 0.33, "hw_power_brake_slowdown": 0.33}})
    snap = make_snapshot(1, time=NOW, readings=states,
                         straggler_analysis=StragglerAnalysis(NOW, window, None, None))
    found = findings(snap, checks_say(1, {0: {"thermal_violation": OK,
                                              "power_violation": WARNING}}))
    assert _kinds(found) == [("clock_event", "warning", 0)]
    assert found[0]["details"]["verdict"]["check"] == "power_violation"
    assert found[0]["message"] == (
        "GPU 0 clocks held down by HW slowdown (not active now; 33 % of the last 60 s), "
        "HW power brake (not active now; 33 % of the last 60 s)")


def test_clock_event_shares_come_from_the_window_features_as_computed():
    """The finding reads each reason's share under the name window_features gives it:
    an SW thermal slowdown over the window, not active now, is still told."""
    t = np.arange(60.0)
    reasons = np.zeros((1, 60))
    reasons[0, :15] = CLOCK_EVENT_REASONS["sw_thermal_slowdown"]
    window = window_features(t, np.full((1, 60), 500.0), clock_event_reasons=reasons)
    states = {0: GpuReading(NOW - 1, {"clock_event_reasons": 0x0})}
    snap = make_snapshot(1, time=NOW, readings=states,
                         straggler_analysis=StragglerAnalysis(NOW, window, None, None))
    found = findings(snap, checks_say(1, {0: {"thermal_violation": WARNING}}))
    assert _kinds(found) == [("clock_event", "warning", 0)]
    assert found[0]["message"] == ("GPU 0 clocks held down by SW thermal slowdown "
                                   "(not active now; 25 % of the last 59 s)")


def test_a_healthy_node_has_no_findings_and_every_finding_is_json():
    assert findings(make_snapshot(8, time=NOW)) == []
    cycle = CycleFeatures(22.4, 1 / 22.4, 0.66, 1500.0, None, {}, 0.74, 0.95, 3346.0)
    snap = make_snapshot(8, time=NOW, power_analysis=_power(True, cycle),
                         straggler_analysis=_stragglers(), xids={(1, 31): XidRecord(1, NOW)})
    found = findings(snap)
    assert json.loads(json.dumps(found, allow_nan=False)) == found
    assert {f["kind"] for f in found} == {"power_swing", "power_cycle", "straggler", "xid"}
    for f in found:
        assert set(f) == {"kind", "severity", "gpu", "time", "since", "message", "details"}


def test_wording_helpers():
    assert [duration(s) for s in (5, 89, 360, 3600, 3900, 90000)] == [
        "5 s", "89 s", "6 min", "1 h", "1 h 5 min", "1 d 1 h"]
    assert gpu_list([3]) == "GPU 3"
    assert gpu_list([0, 1, 2, 5, 7, 8]) == "GPUs 0-2, 5, 7, 8"
