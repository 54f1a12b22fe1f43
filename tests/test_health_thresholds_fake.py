"""Each health threshold on the fake, through pynvml and the real sweep: a scenario just
below the limit and one at it (past it where the rule is 'above'), judged by the running
exporter after a full minute of health reads (simulated time)."""

from __future__ import annotations

import pytest

from tests.tools import ExporterFactory

RETIRING = "device: {retired_pages: true}\n"


def judged(tmp_path, events: list[str], check: str, until: float = 70.0, device: str = ""):
    path = tmp_path / "scenario.yaml"
    path.write_text("gpus: 2\n" + device + "events:\n" + "".join(f"  - {e}\n" for e in events))
    factory = ExporterFactory()
    try:
        # a slow sweep every 5 s: the minute holds 12 (the default, 15 s, would hold 4)
        exporter = factory.start(manual=True, scenario=str(path),
                                 gpu_health_interval_seconds=5.0)
        exporter.sampler.advance(until)
        verdict = exporter.current.verdict.gpus[1]
        other = exporter.current.verdict.gpus[0]
        assert other.state == "ok", other.reasons  # the faults are on GPU 1 alone
        return next(c for c in verdict.checks if c.name == check)
    finally:
        factory.stop_all()


CASES = [
    # (check, below, at, state at the limit)
    ("pcie_replays", ["{kind: pcie, at: 2, gpu: 1, replays_per_minute: 31}"],
     ["{kind: pcie, at: 2, gpu: 1, replays_per_minute: 32}"], "warning"),  # Gen5 x16: 31
    ("pcie_link", ["{kind: pcie, at: 2, gpu: 1, generation: 5}"],
     ["{kind: pcie, at: 2, gpu: 1, generation: 4}"], "warning"),
    ("pcie_link_width", ["{kind: pcie, at: 2, gpu: 1, width: 16}"],
     ["{kind: pcie, at: 2, gpu: 1, width: 8}"], "warning"),
    ("hw_slowdown", ["{kind: clock_event, at: 2, gpu: 1, reasons: [sw_thermal_slowdown]}"],
     ["{kind: clock_event, at: 2, gpu: 1, reasons: [hw_slowdown]}"], "warning"),
    # 99/s is past the warning (1 a minute) but below the failure (100/s)
    ("nvlink_errors", ["{kind: nvlink, at: 2, gpu: 1, link: 3, crc_flit_per_second: 99}"],
     ["{kind: nvlink, at: 2, gpu: 1, link: 3, crc_flit_per_second: 100}"], "failed"),
    ("nvlink_errors", ["{kind: nvlink, at: 30, until: 30.5, gpu: 1, link: 3, "
                       "crc_flit_per_second: 0}"],
     ["{kind: nvlink, at: 30, until: 31, gpu: 1, link: 3, crc_flit_per_second: 1}"],
     "warning"),
    ("nvlink_replays", ["{kind: nvlink, at: 30, until: 30.5, gpu: 1, link: 3, "
                        "replay_per_second: 0}"],
     ["{kind: nvlink, at: 30, until: 31, gpu: 1, link: 3, replay_per_second: 1}"], "failed"),
    ("nvlink_links", ["{kind: nvlink, at: 2, gpu: 1, link: 3, crc_flit_per_second: 0}"],
     ["{kind: nvlink, at: 2, gpu: 1, link: 3, down: true}"], "failed"),
    ("ecc_uncorrected", ["{kind: ecc, at: 2, gpu: 1, corrected: 40}"],
     ["{kind: ecc, at: 2, gpu: 1, corrected: 40, uncorrected: 1}"], "failed"),
    ("remapped_rows", ["{kind: row_remap, at: 2, gpu: 1, uncorrectable: 511}"],
     ["{kind: row_remap, at: 2, gpu: 1, uncorrectable: 512}"], "warning"),
    ("row_remap_failure", ["{kind: row_remap, at: 2, gpu: 1, uncorrectable: 3}"],
     ["{kind: row_remap, at: 2, gpu: 1, uncorrectable: 3, failure: true}"], "failed"),
    ("row_remap_pending", ["{kind: row_remap, at: 2, gpu: 1, correctable: 1}"],
     ["{kind: row_remap, at: 2, gpu: 1, correctable: 1, pending: true}"], "warning"),
    ("thermal_violation", ["{kind: clock_event, at: 2, gpu: 1, reasons: [gpu_idle]}"],
     ["{kind: clock_event, at: 2, gpu: 1, reasons: [hw_thermal_slowdown]}"], "warning"),
    ("power_violation", ["{kind: clock_event, at: 2, gpu: 1, reasons: [sw_power_cap]}"],
     ["{kind: clock_event, at: 2, gpu: 1, reasons: [hw_power_brake_slowdown]}"], "warning"),
    ("recovery_action", ["{kind: recovery_action, at: 2, gpu: 1, action: none}"],
     ["{kind: recovery_action, at: 2, gpu: 1, action: gpu_reset}"], "failed"),
    ("xid", ["{kind: xid, at: 2, gpu: 1, code: 13}"],
     ["{kind: xid, at: 2, gpu: 1, code: 48}"], "failed"),
]


@pytest.mark.parametrize("check, below, at, state", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_just_below_and_at_the_limit_on_the_fake(tmp_path, check, below, at, state):
    crc_warning = "crc_flit_per_second: 99" in below[0]
    assert judged(tmp_path, below, check).state == ("warning" if crc_warning else "ok")
    assert judged(tmp_path, at, check).state == state


@pytest.mark.parametrize("check, below, at, state", [
    ("retired_pages", ["{kind: retired_pages, at: 2, gpu: 1, single_bit: 50, double_bit: 12}"],
     ["{kind: retired_pages, at: 2, gpu: 1, single_bit: 50, double_bit: 13}"], "failed"),
    ("retired_pages_recent", ["{kind: retired_pages, at: 2, gpu: 1, double_bit: 15}"],
     ["{kind: retired_pages, at: 2, gpu: 1, double_bit: 16}"], "failed"),
    ("retired_pages_pending", ["{kind: retired_pages, at: 2, gpu: 1, single_bit: 1}"],
     ["{kind: retired_pages, at: 2, gpu: 1, single_bit: 1, pending: true}"], "warning"),
])
def test_page_retirement_limits_on_a_pre_hopper_fake(tmp_path, check, below, at, state):
    assert judged(tmp_path, below, check, device=RETIRING).state == "ok"
    assert judged(tmp_path, at, check, device=RETIRING).state == state
