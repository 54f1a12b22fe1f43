"""The step swing inside compute plateaus (analysis.step_segments), offline and live."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from exporter.analysis.power_swing import analyse_window
from exporter.analysis.step_segments import find_step_swing, grid_relevant, plateaus
from exporter.commands.analyze import build_parser
from exporter.metrics.render import render
from exporter.offline.swings import merge_step_swings
from exporter.sim.step_family import (
    StepCase,
    draw_case,
    family,
    held_out_like,
    readings,
    true_amplitude,
    write_trace,
)

CLI = [sys.executable, "-m", "exporter"]


def _hit(case: StepCase) -> bool:
    t, p = readings(case)
    swing = find_step_swing(t, p, observable_hz=case.observable_hz).swing
    if swing is None:
        return False
    truth = true_amplitude(case)
    assert case.swing_hz is not None
    return (abs(swing.frequency_hz - case.swing_hz) <= 0.05 * case.swing_hz
            and abs(swing.amplitude_watts - truth) <= 0.20 * truth)


def test_the_family_meets_recall_and_precision():
    """A seeded sample of the family (bench/eval_step_swing.py runs the large one)."""
    cases = family(30, 8, seed=7)
    swings = [c for c in cases if c.kind == "swing"]
    silent = [c for c in cases if c.kind != "swing"]
    recall = np.mean([_hit(c) for c in swings])
    false = [c for c in silent
             if find_step_swing(*readings(c), observable_hz=c.observable_hz).swing is not None]
    assert recall >= 0.95
    assert len(false) <= 0.05 * len(silent), false
    # the sample spans what the family promises
    assert {c.averaged for c in swings} == {True, False}
    assert min(c.amplitude for c in swings) < 0.06 and max(c.amplitude for c in swings) > 0.25
    assert {c.kind for c in silent} == {"healthy", "idle", "independent"}


def test_the_swing_between_pauses_that_a_straddling_window_misses():
    case = held_out_like()
    t, p = readings(case)
    res = find_step_swing(t, p, observable_hz=case.observable_hz)
    swing = res.swing
    assert swing is not None
    assert swing.frequency_hz == pytest.approx(2.4, rel=0.02)
    assert swing.period_seconds == pytest.approx(1 / 2.4, rel=0.02)
    assert swing.amplitude_watts == pytest.approx(true_amplitude(case), rel=0.2)
    assert swing.synchrony > 0.9 and swing.confidence >= 0.999 and swing.duty > 0.8
    # the plateaus are the compute phases: ~20 s each less the trimmed edges, no pause inside
    assert len(res.plateaus) >= 4
    assert all(12 < b - a < 21 for a, b in res.plateaus[1:-1])
    assert res.pause_seconds == pytest.approx(case.seconds * 15 / 36, rel=0.15)
    # a 30 s window straddling a pause edge: the edge's energy wins, no 2.4 Hz swing there
    edge = (t >= t[0] + 20) & (t < t[0] + 50)
    ns = analyse_window(t[edge], p[:, edge], np.full(2, 700.0), max_observable_hz=5.0)
    assert ns.node.frequency_hz is None or abs(ns.node.frequency_hz - 2.4) > 0.12
    # 10 % of ~2 x 475 W is far below 20 % of TDP: seen, not grid-relevant
    assert swing.amplitude_ratio is None
    assert not grid_relevant(swing, 0.20, (0.1, 3.0))
    assert grid_relevant(swing, 0.05, (0.1, 3.0))
    assert not grid_relevant(swing, 0.05, (0.1, 2.0))  # outside the swing band


@pytest.mark.parametrize("seed", [
    100353,  # a 3.76 Hz square swing read at 10 Hz: its folded harmonics fake a 1.25 Hz one
    100037,  # a 2.47 Hz swing at 10 Hz: a grid between jittered polls cuts its peaks by 20 %
    100029,  # a 0.31 Hz swing through a 1 s average: its 5th harmonic beyond the band
])
def test_cases_that_once_went_wrong(seed):
    assert _hit(draw_case("swing", seed))


@pytest.mark.parametrize("kind", ["healthy", "idle", "independent"])
def test_silent_cases_say_why(kind):
    case = dataclasses.replace(draw_case(kind, 3), gpus=8, averaged=False, interval_s=0.05,
                               pause_fraction=0.4)
    res = find_step_swing(*readings(case), observable_hz=case.observable_hz)
    assert res.swing is None and res.reason
    if kind == "independent":
        assert "independently" in res.reason


def test_a_swing_at_the_band_edge_is_not_given_a_frequency():
    case = dataclasses.replace(held_out_like(), swing_hz=4.7, shape="smooth", amplitude=0.2)
    res = find_step_swing(*readings(case), observable_hz=5.0)
    assert res.swing is None and "edge" in (res.reason or "")


def test_one_gpu_and_missing_rows():
    case = dataclasses.replace(held_out_like(), gpus=3)
    t, p = readings(case)
    alone = find_step_swing(t, p[:1], observable_hz=5.0).swing
    assert alone is not None and alone.synchrony == 1.0
    p = p.copy()
    p[2] = np.nan  # a GPU without readings is left out
    p[1, 100:110] = np.nan  # a short gap is bridged
    swing = find_step_swing(t, p, np.full(3, 700.0), observable_hz=5.0).swing
    assert swing is not None and swing.frequency_hz == pytest.approx(2.4, rel=0.02)
    assert swing.amplitude_ratio == pytest.approx(swing.amplitude_watts / 1400.0)


def test_bad_and_empty_input():
    t = 1e9 + np.arange(600) * 0.1
    with pytest.raises(ValueError):
        find_step_swing(t[:5], np.ones((1, 5)))
    with pytest.raises(ValueError):
        find_step_swing(t, np.ones((2, 7)))  # rows do not match the times
    assert find_step_swing(t, np.full((2, 600), np.nan)).reason == "no GPU has power readings"
    flat = find_step_swing(t, np.full((2, 600), 400.0))
    assert flat.swing is None
    # always paused: idle after a short burst, no plateau long enough
    burst = np.where(np.arange(600) < 30, 600.0, 80.0)[None, :]
    assert find_step_swing(t, burst).swing is None


def test_plateaus_split_at_pauses_and_keep_the_swing():
    dt = 0.1
    i = np.arange(1200)
    on = (i // 200) % 2 == 0  # 20 s on, 20 s off
    node = np.where(on, 1000 + 200 * np.sign(np.sin(2 * np.pi * 0.5 * i * dt)), 200.0)
    ranges, paused = plateaus(node, dt)
    assert len(ranges) == 3 and paused == pytest.approx(600, abs=30)
    for a, b in ranges:
        assert on[a:b].all()  # no pause sample, and the swing's lows did not split it
        assert (b - a) * dt == pytest.approx(20 - (3 if a else 1.5), abs=0.3)


def test_merge_step_keeps_one_entry_per_swing():
    windowed = [{"scale": "step", "resolved": True, "frequency_hz": 0.5, "start": 0.0,
                 "end": 100.0}]
    same = {"scale": "step", "resolved": True, "method": "segments", "frequency_hz": 0.52,
            "start": 10.0, "end": 200.0, "significance": 50.0, "confidence": 1.0,
            "duty": 0.9, "plateaus": 4}
    other = dict(same, frequency_hz=2.0)
    out = merge_step_swings(windowed, [same, other])
    assert len(out) == 2
    assert out[0]["grid_relevant"] is True and out[0]["significance"] == 50.0
    assert out[1]["frequency_hz"] == 2.0


def test_analyze_reports_a_small_swing_and_says_it_is_below_the_grid_threshold(tmp_path):
    trace = write_trace(held_out_like(), tmp_path / "held.cte")
    out = subprocess.run([*CLI, "analyze", str(trace), "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    steps = [s for s in rep["power_swings"] if s.get("method") == "segments"]
    assert len(steps) == 1
    s = steps[0]
    assert s["frequency_hz"] == pytest.approx(2.4, rel=0.02)
    assert s["grid_relevant"] is False and s["confidence"] >= 0.999
    assert 0 < s["amplitude_ratio"] < 0.2 and s["duty"] > 0.8
    # the 36 s pause cycle is a pattern of its own, not a beat of the step swing
    assert any(c["scale"] == "cycle" and c["period_seconds"] == pytest.approx(36, rel=0.05)
               for c in rep["power_swings"])
    text = subprocess.run([*CLI, "analyze", str(trace), "--min-amplitude-ratio", "0.05"],
                          capture_output=True, text=True, timeout=120)
    assert "step period 0.41" in text.stdout and "grid-relevant" in text.stdout
    bad = subprocess.run([*CLI, "analyze", str(trace), "--segment-window", "-3"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--segment-window" in bad.stderr


def test_live_and_offline_agree_on_a_replayed_trace(tmp_path, running_exporter):
    """The trace replayed at speed 1 on a manual clock: the live monitor's step period and
    analyze's agree within 2 %."""
    case = held_out_like(seed=5, seconds=150.0)
    path = write_trace(case, tmp_path / "replayed.cte")
    args = build_parser().parse_args([str(path)])
    from exporter.commands.analyze import analyse_trace
    from exporter.traces.load import load_trace

    offline = [s for s in analyse_trace(load_trace(path), args)["power_swings"]
               if s.get("method") == "segments"]
    assert len(offline) == 1
    exp = running_exporter.start(manual=True, fake=False, replay=str(path))
    exp.sampler.advance(125)
    analysis = exp.sampler.snapshot.power_analysis
    assert analysis is not None and analysis.step_swing is not None
    live = analysis.step_swing
    assert live.period_seconds == pytest.approx(offline[0]["period_seconds"], rel=0.02)
    assert live.period_seconds == pytest.approx(1 / 2.4, rel=0.02)
    # the same swing, not only the same rhythm
    assert live.amplitude_watts == pytest.approx(offline[0]["node_amplitude_watts"], rel=0.2)
    assert live.synchrony == pytest.approx(offline[0]["synchrony"], abs=0.1)
    body = render(exp.sampler.snapshot).decode()
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in body.splitlines()
              if line.startswith("gpu_node_power_swing_step_")}
    assert values["gpu_node_power_swing_step_detected"] == 1.0
    assert values["gpu_node_power_swing_step_grid_relevant"] == 0.0
    assert values["gpu_node_power_swing_step_period_seconds"] == pytest.approx(
        live.period_seconds, rel=1e-9)


def test_the_running_extremes_match_the_sliding_window():
    from exporter.analysis.ramps import _rolling
    from exporter.analysis.step_segments import _running

    rng = np.random.default_rng(1)
    for n in (5, 17, 100, 1001):
        for w in (1, 2, 3, 4, 7, 50):
            x = rng.normal(size=n)
            assert np.array_equal(_running(x, w, np.maximum), _rolling(x, w, "max"))
            assert np.array_equal(_running(x, w, np.minimum), _rolling(x, w, "min"))


def _some_flat(gpus: int, flat: range) -> tuple[np.ndarray, np.ndarray]:
    """held_out_like on `gpus` GPUs, those in `flat` at the same work and pauses, no swing."""
    case = dataclasses.replace(held_out_like(), gpus=gpus)
    t, p = readings(case)
    quiet = readings(dataclasses.replace(case, amplitude=0.0))[1]
    p = p.copy()
    p[list(flat)] = quiet[list(flat)]
    return t, p


def test_a_partly_coherent_node_is_not_a_node_swing():
    # 2 of 4 GPUs swing in phase, 2 stay flat: var(sum) / (N sum var) = 4v / (4 * 2v) = 0.5,
    # past the 1.5/N floor (0.375) but short of the 0.7 a node swing needs
    t, p = _some_flat(4, range(2, 4))
    res = find_step_swing(t, p, observable_hz=5.0)
    assert res.swing is None and res.reason == "the GPUs swing independently (synchrony 0.50)"
    # all four in phase: a swing
    whole = find_step_swing(*readings(dataclasses.replace(held_out_like(), gpus=4)),
                            observable_hz=5.0).swing
    assert whole is not None and whole.synchrony > 0.9


def test_min_synchrony_moves_the_gate_but_never_below_the_floor_of_independent_gpus():
    t, p = _some_flat(4, range(2, 4))
    lowered = find_step_swing(t, p, observable_hz=5.0, min_synchrony=0.4).swing
    assert lowered is not None and lowered.synchrony == pytest.approx(0.5, abs=0.05)
    assert lowered.frequency_hz == pytest.approx(2.4, rel=0.02)
    # raised past what a fully coherent node reaches: nothing is a swing
    t4, p4 = readings(dataclasses.replace(held_out_like(), gpus=4))
    raised = find_step_swing(t4, p4, observable_hz=5.0, min_synchrony=0.99)
    assert raised.swing is None and "independently (synchrony 0.9" in (raised.reason or "")
    # one of two GPUs swinging alone reads 0.5, which is what two independent GPUs give:
    # 1.5/N = 0.75 holds even when min_synchrony is set lower
    t2, p2 = _some_flat(2, range(1, 2))
    alone = find_step_swing(t2, p2, observable_hz=5.0, min_synchrony=0.3)
    assert alone.swing is None and "independently (synchrony 0.5" in (alone.reason or "")
