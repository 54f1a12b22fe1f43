"""analyze on synthetic traces whose truth is known (tests/synth_power.py).

Several GPU generations, sampling every 0.05-10 s, instantaneous and 1 s-averaged
sensors, square and smooth swings at 0.2-5 Hz, pauses.  On every trace:

- the sensor's kind (instantaneous / averaged) is decided correctly;
- a swing the samples resolve is reported at its frequency (within 5 %) and
  amplitude (within 15 %; through an average, the fitted amplitude at the GPUs);
- a swing above the observable band (or at its edge) is reported as unresolved,
  never as a slower frequency; one a 1 s average removes is not reported at all;
- no other frequency is reported (no cycles, no second swing);
- every pause deeper than 30 % of the node's power is a dip with both edges as
  ramps, at the right time and for the right duration.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from exporter.commands import analyze
from exporter.traces.load import load_trace
from tests.synth_power import FOLDED, MATRIX, NONE, RESOLVED, T0, UNRESOLVED, Truth, write_trace


def report(truth: Truth, tmp_path: Path) -> tuple[dict, float]:
    """(analyze's JSON report, the trace's start in the generator's seconds)."""
    path = write_trace(truth.case, tmp_path)
    trace = load_trace(path)
    args = analyze.build_parser().parse_args([str(path)])
    start = max(float(s.t[0]) for s in trace.series.values()) - T0
    return analyze.analyse_trace(trace, argparse.Namespace(**vars(args))), start


@pytest.mark.parametrize("label", sorted(MATRIX))
def test_truth(label: str, tmp_path: Path) -> None:
    truth = MATRIX[label]
    case = truth.case
    rep, start = report(truth, tmp_path)
    pa = rep["power_averaging"]
    assert pa["kind"] == truth.kind, pa
    assert pa["evidence"] and pa["confidence"] in ("high", "medium")
    steps = [s for s in rep["power_swings"] if s["scale"] == "step"]
    resolved = [s for s in steps if s["resolved"]]
    unresolved = [s for s in steps if not s["resolved"]]
    assert not [s for s in rep["power_swings"] if s["scale"] == "cycle"]  # none in the truth
    if truth.swing == RESOLVED:
        assert resolved and not unresolved, steps
        for s in resolved:
            assert s["frequency_hz"] == pytest.approx(case.swing_hz, rel=0.05)
            amp = s.get("source_amplitude_watts") or s["node_amplitude_watts"]
            assert amp == pytest.approx(case.node_amplitude_w, rel=0.15)
            assert s["period_seconds"] == pytest.approx(1 / s["frequency_hz"])
    elif truth.swing in (UNRESOLVED, FOLDED):
        assert unresolved and not resolved, steps
        for s in unresolved:
            assert s["frequency_hz"] is None and s["above_hz"] < case.swing_hz
            app = s["apparent_frequency_hz"]
            assert (app is None) if truth.swing == FOLDED else \
                app == pytest.approx(case.swing_hz, rel=0.05)
    else:
        assert truth.swing == NONE and not steps
    _check_pauses(truth, rep, start)


def _check_pauses(truth: Truth, rep: dict, start: float) -> None:
    case = truth.case
    dt = rep["sample_interval_seconds"]
    # the edge of a pause can be that of the swing's low phase next to it
    slack = max(1.5, 2 * dt, 1 / case.swing_hz if case.swing_hz else 0.0)
    dips = rep["dips"]
    assert len(dips) == len(case.pauses)
    for (p_start, p_len), dip in zip(case.pauses, dips, strict=True):
        assert dip["start"] + start == pytest.approx(p_start, abs=slack)
        assert dip["duration_seconds"] == pytest.approx(p_len, abs=2 * slack)
        mean_before = case.training_mean_w if case.swing_hz else case.gpus * case.high_w
        assert dip["depth_ratio"] == pytest.approx(1 - case.gpus * case.pause_w / mean_before,
                                                   abs=0.06)
        edges = [r for r in rep["ramps"] if r["dip"] == dips.index(dip)]
        assert [r["direction"] for r in edges] == ["fall", "rise"]
        assert edges[0]["time"] == pytest.approx(dip["start"])
        assert edges[1]["time"] == pytest.approx(dip["end"])
    # the run's start and end, if any, are the only other ramps
    level = [(r["direction"], r["time"] + start) for r in rep["ramps"] if r["dip"] is None]
    want = [("rise", case.swing_from)] if case.swing_from > 0 else []
    want += [("fall", case.swing_until)] if case.swing_until is not None else []
    assert [d for d, _ in level] == [d for d, _ in want]
    for (_, t), (_, t_want) in zip(level, want, strict=True):
        assert t == pytest.approx(t_want, abs=slack)


def test_shallow_dip_is_not_a_pause(tmp_path: Path) -> None:
    """A 20 % sag is below the 30 % a dip needs; --dip-ratio 0.15 reports it."""
    from tests.synth_power import Case

    case = Case("sag", swing_hz=None, high_w=500, pause_w=400, pauses=((80.0, 10.0),))
    path = write_trace(case, tmp_path)
    rep = analyze.analyse_trace(load_trace(path), analyze.build_parser().parse_args([str(path)]))
    assert rep["dips"] == []
    rep = analyze.analyse_trace(load_trace(path), analyze.build_parser().parse_args(
        [str(path), "--dip-ratio", "0.15"]))
    assert len(rep["dips"]) == 1 and math.isclose(rep["dips"][0]["depth_ratio"], 0.2,
                                                  abs_tol=0.03)


def test_forced_average_never_names_a_slower_frequency(tmp_path: Path) -> None:
    """The issue's case: a sharp 0.625 Hz swing at 20 Hz read as a 1 s average
    (here by --power-averaging 1, as analyze once assumed for any power.draw) was
    reported as five step swings at 0.11-0.37 Hz.  Now: one unresolved swing."""
    truth = MATRIX["noname-20hz-square-0.625"]
    path = write_trace(truth.case, tmp_path)
    args = analyze.build_parser().parse_args([str(path), "--power-averaging", "1"])
    rep = analyze.analyse_trace(load_trace(path), args)
    assert rep["power_averaging"]["decided_by"] == "flag"
    assert any("disagree" in e for e in rep["power_averaging"]["evidence"])
    swings = rep["power_swings"]
    assert [(s["scale"], s["resolved"]) for s in swings] == [("step", False)]
    assert swings[0]["above_hz"] == pytest.approx(0.45)
    assert swings[0]["apparent_frequency_hz"] == pytest.approx(0.625, rel=0.02)
    assert swings[0]["node_amplitude_watts"] > 0.9 * truth.case.node_amplitude_w
