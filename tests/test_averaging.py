"""analysis.averaging: telling a 1 s-averaged power reading from an instantaneous one."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.analysis.averaging import (
    AVERAGED,
    INSTANT,
    averaging_evidence,
    sensor_update_seconds,
    source_swing,
)
from tests.synth_power import Case, sensor_readings


def evidence(case: Case):
    t, p = sensor_readings(case)
    return averaging_evidence([(t, p[g]) for g in range(p.shape[0])])


def test_sharp_edges_prove_no_average() -> None:
    ev = evidence(Case("sq", gpus=4, seconds=90))  # 0.625 Hz square at 20 Hz
    assert (ev.verdict, ev.proof) == (INSTANT, True)
    assert "edges" in ev.reason and ev.stats["fast_edges"] >= 3


def test_edges_that_take_a_second_look_averaged() -> None:
    ev = evidence(Case("sq", gpus=4, seconds=90, swing_hz=0.2, averaged=True))
    assert (ev.verdict, ev.proof) == (AVERAGED, False)  # consistent, never a proof
    assert 0.6 < ev.stats["median_edge_seconds"] < 1.3


def test_a_large_swing_above_1_hz_proves_no_average() -> None:
    ev = evidence(Case("sine", gpus=2, seconds=90, swing_hz=2.4, shape="smooth",
                       interval_s=0.1))
    assert (ev.verdict, ev.proof) == (INSTANT, True)
    assert "above 1.1 Hz" in ev.reason


def test_what_an_average_leaves_of_a_fast_swing_is_no_proof() -> None:
    # 1.5 Hz through a 1 s average keeps 21 % of the swing: large, but not too large
    ev = evidence(Case("sine", gpus=8, seconds=90, swing_hz=1.5, averaged=True,
                       interval_s=0.1))
    assert ev.verdict != INSTANT


@pytest.mark.parametrize(("averaged", "verdict"), [(False, INSTANT), (True, AVERAGED)])
def test_noise_floor_tells_a_steady_node(averaged: bool, verdict: str) -> None:
    ev = evidence(Case("flat", gpus=4, seconds=90, swing_hz=None, averaged=averaged))
    assert ev.verdict == verdict
    ratio = ev.stats["noise_floor_ratio"]
    assert (ratio > 0.3) if verdict == INSTANT else (ratio < 0.1)


def test_sparse_samples_cannot_tell() -> None:
    ev = evidence(Case("slow", gpus=4, seconds=600, interval_s=5.0, swing_hz=None))
    assert ev.verdict is None and "cannot time" in ev.reason


def test_sensor_update_period_from_repeated_readings() -> None:
    t, p = sensor_readings(Case("upd", gpus=1, seconds=30, sensor_update_s=0.1))
    assert sensor_update_seconds(t, p[0]) == pytest.approx(0.1, rel=0.1)
    t, p = sensor_readings(Case("upd", gpus=1, seconds=30))  # updates every 20 ms: no repeats
    assert sensor_update_seconds(t, p[0]) is None
    # flat data that changes only now and then is no sensor rhythm
    t = np.arange(600.0)
    assert sensor_update_seconds(t, np.where(t % 60 < 20, 250.0, 650.0)) is None


@pytest.mark.parametrize(("shape", "f"), [("square", 0.2), ("smooth", 0.3), ("smooth", 0.4)])
def test_source_swing_behind_the_average(shape: str, f: float) -> None:
    case = Case("src", gpus=4, seconds=120, swing_hz=f, shape=shape, averaged=True)
    t, p = sensor_readings(case)
    node = p.sum(axis=0)
    seen = float(np.percentile(node, 95) - np.percentile(node, 5))
    watts, fitted = source_swing(t, node, f, 1.0)
    assert watts == pytest.approx(case.node_amplitude_w, rel=0.05)
    assert fitted.startswith("sine" if shape == "smooth" else "square")
    if shape == "smooth":
        assert seen < 0.9 * case.node_amplitude_w  # what p95 - p5 alone would have said


def test_source_swing_needs_periods_and_samples() -> None:
    t = np.arange(0, 10, 1.0)
    assert source_swing(t, np.sin(t), 0.4, 0.0) is None  # 2.5 samples per period
    t = np.arange(0, 6, 0.05)
    assert source_swing(t, np.sin(t), 0.5, 0.0) is None  # 3 periods
