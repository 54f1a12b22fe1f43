"""Live straggler and stall findings on the fake's scenarios: the right GPU and signal,
and nothing on a healthy node. Windows and persistence are shortened (10 s / 5 s), and
the sampler runs in simulated time."""

from __future__ import annotations

import pytest

from exporter.gpu.backend import NvmlBackend
from exporter.metrics.render import render
from exporter.sampling.clock import ManualClock
from exporter.sampling.sampler import Sampler, SamplerSettings
from exporter.sampling.settings import StragglerSettings
from exporter.sim import fake
from exporter.sim.scenarios import load_scenario
from tests.tools import scenario_from_yaml, simulated_snapshot

FAST = StragglerSettings(window_seconds=10, update_seconds=1, persistence_seconds=5)


def run(scenario, seconds: float = 14):
    return simulated_snapshot(scenario, seconds, SamplerSettings(
        stragglers=FAST, xid_events=False, power=None))


def findings(snapshot) -> dict[int, set[str]]:
    report = snapshot.straggler_analysis.report
    return {gpu: set(g.signals) for gpu, g in report.gpus.items() if g.straggler}


@pytest.mark.parametrize(("scenario", "gpu", "signals"), [
    ("straggler", 5, {"sm_clock", "duty_cycle"}),
    ("power-capped", 2, {"power", "sm_clock"}),
    ("hot-gpu", 3, {"temperature"}),
])
def test_each_scenario_yields_its_gpu_and_signal_and_nothing_else(scenario, gpu, signals):
    snap = run(load_scenario(scenario))
    found = findings(snap)
    assert set(found) == {gpu}, found
    assert signals <= found[gpu]
    if scenario == "hot-gpu":
        assert found[gpu] == {"temperature"}  # otherwise healthy
    text = render(snap).decode()
    assert f'gpu_straggler{{gpu="{gpu}",' in text
    assert f'gpu_straggler{{gpu="{gpu}",uuid="{snap.identities[gpu].uuid}"}} 1.0' in text


def test_healthy_training_yields_no_finding():
    snap = run(load_scenario("training"), seconds=20)
    assert findings(snap) == {}
    assert snap.straggler_analysis.report.peer_statistics
    assert snap.straggler_analysis.stalls_total == 0


CHECKPOINTS = """
gpus: 8
workload: {type: training, checkpoint_every_seconds: 12, checkpoint_seconds: 5,
           checkpoint_gpu: 0, wait_watts: 150}
"""


def test_rank_0_writing_checkpoints_is_no_stall_and_another_gpu_stopping_is():
    """The signature is the same; the goodput account tells the stall check that rank 0
    writing in its rhythm is a checkpoint (docs/goodput.md), and GPU 3 stopping is not."""
    snap = run(scenario_from_yaml(CHECKPOINTS), seconds=40)
    a = snap.straggler_analysis
    assert a.stalls_total == 0 and not any(a.culprit_seconds.values())
    other = CHECKPOINTS.replace("checkpoint_gpu: 0", "checkpoint_gpu: 3")
    snap = run(scenario_from_yaml(other), seconds=40)
    a = snap.straggler_analysis
    assert a.stalls_total >= 1
    assert a.culprit_seconds.get(3, 0) > 2
    assert all(a.culprit_seconds.get(g, 0) == 0 for g in range(8) if g != 3)


TWO_GPUS = """
gpus: 2
workload: {type: training}
gpu_overrides:
  - {gpu: 1, temperature_offset_celsius: 30}
"""


def test_tiny_node_says_it_has_no_peer_statistics():
    snap = run(scenario_from_yaml(TWO_GPUS), seconds=8)
    report = snap.straggler_analysis.report
    assert not report.peer_statistics and "at least 3" in report.reason
    assert findings(snap) == {}
    assert "gpu_node_straggler_peer_statistics 0.0" in render(snap).decode()


def test_a_starved_exporter_holds_its_findings_instead_of_inventing_them():
    """When the exporter itself is short of CPU (power samples lost before a drain,
    sweeps skipped), its sampling trouble must not become a finding about a GPU."""
    clock = ManualClock()
    with fake.installed(load_scenario("straggler"), clock, costs=None):
        sampler = Sampler(NvmlBackend(), SamplerSettings(stragglers=FAST, xid_events=False,
                                                         power=None), clock=clock)
        sampler.start(threads=False)
        try:
            sampler.advance(20)
            before = sampler.build_snapshot().straggler_analysis
            assert not before.held and before.features is not None
            assert before.coverage == {"power": 1.0, "sweep": 1.0}
            clock.advance(6)  # starved for 6 s: the driver's buffer (2.4 s) overflowed
            sampler.advance(2)
            held = sampler.build_snapshot().straggler_analysis
            assert held.held and held.coverage["power"] < 0.9 and held.features is None
            assert held.report is before.report  # findings held, not recomputed
            text = render(sampler.build_snapshot()).decode()
            assert "gpu_node_straggler_analysis_held 1.0" in text
            assert "gpu_window_power_watts{" not in text
            sampler.advance(12)  # a clean window again: analysed again
            after = sampler.build_snapshot().straggler_analysis
            assert not after.held and after.features is not None
        finally:
            sampler.stop()
