"""Live power analysis in the exporter: a clear swing on `training`, none on idle or
independent GPUs, measured sensor period, and ramps on a job start."""

from __future__ import annotations

import pytest

from exporter.gpu.backend import NvmlBackend
from exporter.sampling.clock import ManualClock
from exporter.sampling.sampler import Sampler, SamplerSettings
from exporter.sampling.settings import PowerSettings
from exporter.sim import fake
from exporter.sim.scenarios import load_scenario

FAST = PowerSettings(window_seconds=10, update_seconds=1, hold_updates=3)


def run(scenario, seconds: float = 16, start: float = 1_790_000_000.0):
    """The snapshot after `seconds` of simulated time (10 s window, 6 updates)."""
    clock = ManualClock(start)
    with fake.installed(scenario, clock, costs=None):
        sampler = Sampler(NvmlBackend(), SamplerSettings(power=FAST, xid_events=False),
                          clock=clock)
        sampler.start(threads=False)
        try:
            sampler.advance(seconds)
            assert sampler.loop("analysis").iterations >= 6
            return sampler.build_snapshot()
        finally:
            sampler.stop()


def test_training_shows_a_clear_step_swing():
    snap = run(load_scenario("training"))
    a = snap.power_analysis
    assert a.swinging
    node = a.window_swing.node
    assert node.frequency_hz == pytest.approx(0.5, rel=0.05)  # the 2 s step
    assert node.amplitude_ratio > 0.5  # 190 W <-> 680 W on every GPU
    assert a.window_swing.synchrony > 0.9
    assert node.band_energy_ratio > 0.8
    assert 0.55 < node.duty_cycle < 0.75  # compute fraction 0.65
    assert all(f.frequency_hz == pytest.approx(0.5, rel=0.05) for f in a.window_swing.gpus.values())
    phases = [f.phase_radians for f in a.window_swing.gpus.values()]
    assert max(phases) - min(phases) < 0.5  # in phase
    assert a.window_swing.phase_reference_time % FAST.update_seconds == 0
    # the driver's buffer: a sample every ~20 ms, so swings up to ~25 Hz can be seen
    assert snap.power_update_periods == {}  # nothing is polled
    assert snap.observable_band_hz == (0.0, pytest.approx(25.0, rel=0.1))


def test_idle_node_does_not_swing():
    a = run(load_scenario("idle")).power_analysis
    assert not a.swinging
    assert a.window_swing.node.amplitude_ratio < 0.05


def test_independent_gpus_do_not_make_a_node_swing():
    a = run(load_scenario("unsynchronised")).power_analysis
    assert not a.swinging
    assert a.window_swing.synchrony < 0.4
    # each GPU still swings on its own: the per-GPU features see it
    assert sum(f.amplitude_ratio > 0.5 for f in a.window_swing.gpus.values()) >= 6


def test_the_same_swing_has_the_same_phase_on_two_nodes():
    # two separate fake nodes running the same wall-clock-aligned step: the projected
    # phases agree, which is what the cluster coherence rule relies on
    import math
    first = run(load_scenario("training")).power_analysis.window_swing
    second = run(load_scenario("training"), start=1_790_000_123.3).power_analysis.window_swing

    def now_phase(swing, t):
        f = swing.node.frequency_hz
        return swing.node.phase_radians + 2 * math.pi * f * (t - swing.phase_reference_time)

    t = second.phase_reference_time
    diff = (now_phase(first, t) - now_phase(second, t) + math.pi) % (2 * math.pi) - math.pi
    assert abs(diff) < 0.6


def test_monitor_counts_each_ramp_once_and_finds_cycles():
    import numpy as np

    from exporter.sampling.live_power import PowerMonitor

    monitor = PowerMonitor(PowerSettings(cycle_every_seconds=0))
    t = 1_790_000_000.0 + np.arange(0, 700, 0.05)
    node = np.where(t - t[0] < 400, 100.0, 650.0)  # a job starts at 400 s on 4 GPUs
    # checkpoints: every 60 s the power drops for 20 s
    node = np.where(((t - t[0]) % 60 < 20) & (t - t[0] > 400), 200.0, node)
    watts = np.tile(node, (4, 1)) + np.random.default_rng(1).normal(0, 5, (4, t.size))
    times = np.tile(t, (4, 1))
    tdp = np.full(4, 700.0)
    counts = []
    for end in np.arange(380, 700, 5):  # updates every 5 s, as live
        keep = t <= t[0] + end
        result = monitor.update(times[:, keep][:, -1200:], watts[:, keep][:, -1200:], tdp,
                                t[0] + end, band=(0.0, 10.0))
        counts.append(result.ramps_total["rise"])
    # six rise edges (the start at 400 s, then the end of each checkpoint) can be seen;
    # each is counted once although every update for a minute sees it again
    assert counts[0] == 0 and 1 <= counts[-1] <= 6
    first_rise = counts.index(1)
    assert all(c >= 1 for c in counts[first_rise:])
    # the long window sees the 60 s checkpoint cycle
    result = monitor.update(times[:, -12000:], watts[:, -12000:], tdp, t[-1])
    assert result.cycle is not None
    assert result.cycle.period_seconds == pytest.approx(60, rel=0.05)
    assert result.cycle.amplitude_watts > 1000


def test_gpus_sampled_at_different_times_make_no_ramp():
    """A starved exporter starts sampling some GPUs later than others, and drains them at
    different times: parts of the grid have some GPUs and not others. The node's total
    must not read their absence as a fall, nor their arrival as a rise."""
    import numpy as np

    from exporter.sampling.live_power import PowerMonitor

    monitor = PowerMonitor(PowerSettings(cycle_every_seconds=1e9))
    t = 1_790_000_000.0 + np.arange(0, 130, 0.05)
    rng = np.random.default_rng(2)
    watts = 600.0 + rng.normal(0, 5, (8, t.size))  # steady training power, no ramp
    watts[4:, t - t[0] < 15] = np.nan  # GPUs 4-7: first sampled 15 s after GPUs 0-3
    times = np.tile(t, (8, 1))
    tdp = np.full(8, 700.0)
    for end in np.arange(20, 110, 5):
        keep = t <= t[0] + end
        late = watts[:, keep].copy()
        late[4:, -160:] = np.nan  # GPUs 4-7: their last 8 s not drained yet
        result = monitor.update(times[:, keep][:, -1200:], late[:, -1200:], tdp, t[0] + end,
                                band=(0.0, 10.0))
        assert result.ramps_total == {"rise": 0, "fall": 0}, end
    # a real fall is still seen: every GPU drops to idle at 100 s
    watts[:, t - t[0] >= 100] = 80.0
    result = monitor.update(times[:, -1200:], watts[:, -1200:], tdp, t[-1], band=(0.0, 10.0))
    assert result.ramps_total == {"rise": 0, "fall": 1}


def test_the_step_swing_is_analysed_every_step_interval_and_held_between(monkeypatch):
    """find_step_swing (~6 ms on 8 GPUs) runs once per step_every_seconds; the updates in
    between carry its last result, and only those that analyse it read the 2-minute grid."""
    import numpy as np

    from exporter.sampling import live_power
    from exporter.sampling.live_power import PowerMonitor

    calls = []
    real = live_power.find_step_swing
    monkeypatch.setattr(live_power, "find_step_swing",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    settings = PowerSettings(step_every_seconds=15.0, cycle_every_seconds=1e9)
    monitor = PowerMonitor(settings)
    t = 1_790_000_000.0 + np.arange(0, 180, 0.05)
    watts = np.tile(np.where((t % 2.0) < 1.3, 650.0, 200.0), (4, 1))
    steps, reads = [], []
    for end in np.arange(130, 180, 5.0):  # an update every 5 s, as live
        now = t[0] + end
        reads.append(monitor.short_seconds(now))
        keep = (t <= now) & (t > now - reads[-1])
        result = monitor.update(np.tile(t[keep], (4, 1)), watts[:, keep], np.full(4, 700.0),
                                now, band=(0.0, 10.0))
        steps.append(result.step_swing)
    assert len(calls) == 4  # at 130, 145, 160, 175 s: not at each of the 10 updates
    assert reads == [120.0 if i % 3 == 0 else 60.0 for i in range(10)]
    assert all(s is not None and s.frequency_hz == pytest.approx(0.5, rel=0.02) for s in steps)
    assert steps[1] is steps[0] and steps[3] is not steps[0]


def test_the_live_grid_threshold_is_a_setting_of_run_and_analyze(tmp_path):
    """`--power.min-amplitude-ratio` (config key `power_min_amplitude_ratio`) is the live
    twin of analyze's `--min-amplitude-ratio`: it decides whether a swing matters to the
    grid (held swing, step grid relevance), never whether the swing is seen."""
    from exporter.config import Config, load_config_file

    config_file = tmp_path / "config.yaml"
    config_file.write_text("power_min_amplitude_ratio: 0.9\n")
    config = load_config_file(config_file)
    assert config.sampler.power.min_amplitude_ratio == 0.9
    assert Config.of().sampler.power.min_amplitude_ratio == 0.20
    config_file.write_text("power_min_amplitude_ratio: 1.5\n")
    with pytest.raises(Exception, match="power_min_amplitude_ratio"):
        load_config_file(config_file)

    def analysed(threshold: float):
        clock = ManualClock(1_790_000_000.0)
        power = PowerSettings(window_seconds=10, update_seconds=1, hold_updates=3,
                              min_amplitude_ratio=threshold, segment_window_seconds=30,
                              step_every_seconds=1)
        with fake.installed(load_scenario("training"), clock, costs=None):
            sampler = Sampler(NvmlBackend(), SamplerSettings(power=power, xid_events=False),
                              clock=clock)
            sampler.start(threads=False)
            try:
                sampler.advance(40)
                return sampler.build_snapshot().power_analysis
            finally:
                sampler.stop()

    # the training node swings by ~70 % of its TDP: grid-relevant at 0.2, not at 0.9
    low, high = analysed(0.2), analysed(0.9)
    assert low.swinging and low.step_grid_relevant
    assert not high.swinging and not high.step_grid_relevant
    assert high.window_swing is not None and high.step_swing is not None  # seen all the same
