"""The goodput account (analysis.goodput): its rules one second at a time, and analyze's
`time_accounting` on synthetic jobs with known truth (sim.job_story)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from exporter.analysis.goodput import (
    STATES,
    GoodputThresholds,
    Ledger,
    Second,
    account,
    goodput_ratio,
    hold_short_holes,
    lost_runs,
    per_second,
    rolling_mean,
    working,
)
from exporter.commands.analyze import analyse_trace
from exporter.offline.request import AnalyzeRequest
from exporter.sim.job_story import Story, checkpoint_every, draw_story, truth, write_trace
from exporter.traces.load import load_trace

CLI = [sys.executable, "-m", "exporter"]
# the stories the rules were tuned on (bench/eval_goodput.py also reports held-out ones)
TUNING_SEEDS = (0, 2, 3, 6)


def _accounting(story: Story, tmp_path) -> dict:
    path = write_trace(story, tmp_path / f"story-{story.seed}.cte")
    return analyse_trace(load_trace(str(path)), AnalyzeRequest(str(path)))["time_accounting"]


def _second(n: int, *, has=True, power=500.0, works=True, waits=False, stalled=False,
            failed=False, held=None, jobs=None) -> Second:
    def row(v, dtype=bool):
        a = np.asarray(v, dtype=dtype)
        return np.broadcast_to(a, (n,)).copy()
    return Second(1.0, row(has), row(power, float), row(works), row(waits), row(stalled),
                  row(failed), None if held is None else row(held), jobs)


def _states(ledger: Ledger) -> dict[str, float]:
    return {s: float(v) for s, v in zip(STATES, ledger.seconds.sum(axis=0), strict=True) if v}


# ------------------------------------------------------------------ the rules


def test_a_job_starts_steps_pauses_together_and_steps_again():
    ledger = Ledger(2)
    for _ in range(10):
        ledger.step(_second(2, works=False, power=100.0))  # loading
    for _ in range(20):
        ledger.step(_second(2))
    ledger.step(_second(2, works=[True, False]))  # one GPU's short dip: still work
    ledger.step(_second(2))
    for _ in range(15):
        ledger.step(_second(2, works=False, power=80.0))  # both low: a pause
    assert ledger.pending_seconds().tolist() == [15.0, 15.0]  # undecided until it ends
    for _ in range(5):
        ledger.step(_second(2))
    assert _states(ledger) == {"starting": 20.0, "productive": 54.0, "checkpoint": 30.0}
    # energy: the checkpoint's 80 W for 15 s on each GPU
    assert ledger.joules[:, STATES.index("checkpoint")].tolist() == [1200.0, 1200.0]


def test_a_pause_not_followed_by_steps_is_idle_and_one_gpu_low_alone_is_idle():
    ledger = Ledger(2)
    for _ in range(10):
        ledger.step(_second(2))
    for _ in range(8):
        ledger.step(_second(2, works=[True, False]))  # GPU 1 alone
    for _ in range(20):
        ledger.step(_second(2, works=False))
    ledger.close()
    assert _states(ledger) == {"productive": 28.0, "idle": 48.0}
    assert ledger.seconds[1, STATES.index("idle")] == 28.0


def test_a_pause_longer_than_a_checkpoint_is_idle_and_a_never_stepping_job_stops_starting():
    th = GoodputThresholds(max_checkpoint_seconds=30.0, max_start_seconds=20.0)
    ledger = Ledger(1, th)
    for _ in range(25):
        ledger.step(_second(1, works=False))
    for _ in range(5):
        ledger.step(_second(1))
    for _ in range(40):
        ledger.step(_second(1, works=False))
    assert ledger.pending_seconds().tolist() == [0.0]  # decided once past the longest pause
    ledger.step(_second(1))
    assert _states(ledger) == {"starting": 20.0, "idle": 45.0, "productive": 6.0}


def test_a_failure_restarts_the_job_and_its_lost_progress_is_estimated_apart():
    ledger = Ledger(3)
    for _ in range(10):
        ledger.step(_second(3))
    for _ in range(10):
        ledger.step(_second(3, works=False))  # a checkpoint ...
    for _ in range(30):
        ledger.step(_second(3))  # ... then 30 s of steps that a failure loses
    for _ in range(20):  # GPU 2 lost; its peers busy-wait on it (a hung peer)
        ledger.step(_second(3, has=[True, True, False], works=False, waits=True,
                            failed=[False, False, True], power=150.0))
    for _ in range(40):  # killed, restarted, loading; GPU 2 back
        ledger.step(_second(3, works=False, power=100.0))
    for _ in range(10):
        ledger.step(_second(3))
    s = ledger.seconds
    assert s[2, STATES.index("failed")] == 20.0 and s[:2, STATES.index("failed")].sum() == 0
    assert s[:2, STATES.index("stalled")].tolist() == [20.0, 20.0]
    assert s[:, STATES.index("starting")].tolist() == [40.0, 40.0, 40.0]
    assert s[:, STATES.index("checkpoint")].tolist() == [10.0, 10.0, 10.0]
    # never subtracted from productive: reported apart
    assert s[:, STATES.index("productive")].tolist() == [50.0, 50.0, 50.0]
    assert ledger.lost.failures == 1 and ledger.lost.gpu_seconds == 90.0


def test_busy_waiting_that_lasts_is_a_stall_and_a_short_one_a_step():
    ledger = Ledger(3)
    for _ in range(10):
        ledger.step(_second(3))
    ledger.step(_second(3, works=[False, True, True], waits=[False, True, True]))
    for _ in range(5):
        ledger.step(_second(3))
    for _ in range(12):  # GPU 1 (not the first rank) stops, its peers wait on it
        ledger.step(_second(3, works=False, waits=[True, False, True]))
    # named by the stall check
    ledger.step(_second(3, stalled=True, works=False, waits=[True, False, True]))
    for _ in range(5):
        ledger.step(_second(3))
    assert _states(ledger) == {"productive": 63.0, "stalled": 39.0}


def test_holes_are_bridged_up_to_the_limit_then_unknown():
    ledger = Ledger(1, GoodputThresholds(bridge_seconds=3.0))
    for _ in range(5):
        ledger.step(_second(1))
    for _ in range(10):
        ledger.step(_second(1, has=False, works=False, power=np.nan))
    assert _states(ledger) == {"productive": 8.0, "unknown": 7.0}
    assert ledger.joules.sum() == 2500.0  # no reading, no energy


def test_unallocated_gpus_and_a_new_job_starting_on_them():
    ledger = Ledger(2)
    for _ in range(5):
        ledger.step(_second(2, held=[True, False], jobs=["a", "unassigned"]))
    for _ in range(5):  # job b takes GPU 1: it starts
        ledger.step(_second(2, held=True, jobs=["a", "b"], works=[True, False]))
    assert ledger.seconds[0, STATES.index("productive")] == 10.0
    assert ledger.seconds[1, STATES.index("unallocated")] == 5.0
    assert ledger.seconds[1, STATES.index("starting")] == 5.0


def test_states_add_up_to_the_seconds_given():
    rng = np.random.default_rng(1)
    ledger = Ledger(4)
    for _ in range(300):
        ledger.step(Second(0.5, rng.random(4) > 0.1, rng.uniform(50, 700, 4),
                           rng.random(4) > 0.4, rng.random(4) > 0.8, rng.random(4) > 0.95,
                           rng.random(4) > 0.97, rng.random(4) > 0.05,
                           list(rng.choice(["a", "b"], 4))))
    ledger.close()
    assert ledger.seconds.sum(axis=1) == pytest.approx(np.full(4, 150.0))


def test_working_splits_a_wide_range_and_judges_flat_power_by_the_limit():
    power = np.array([[80.0, 600.0, 400.0, 300.0]])
    assert working(power, np.array([80.0]), np.array([600.0])).tolist() == [
        [False, True, True, False]]
    flat = np.array([[500.0, 510.0], [72.0, 73.0]])
    floor, level = flat.min(axis=1), flat.max(axis=1)
    assert working(flat, floor, level, tdp=np.array([700.0, 700.0])).tolist() == [
        [True, True], [False, False]]
    util = np.array([[0.0, 1.0], [0.0, 0.0]])
    assert working(flat, floor, level, util).tolist() == [[False, True], [False, False]]
    # a GPU never near idle (its floor high against its limit) is not split at its midpoint
    busy = np.array([[450.0, 650.0]])
    assert working(busy, np.array([450.0]), np.array([650.0]),
                   tdp=np.array([700.0])).tolist() == [[True, True]]
    assert not working(np.array([np.nan]), np.array([0.0]), np.array([1.0])).any()


def test_helpers_on_edges_and_bad_input():
    assert per_second(np.array([0.2, 0.7, 1.5, 9.0]), np.array([1.0, 3.0, np.nan, 5.0]),
                      0.0, 3).tolist()[0][:2] == [2.0, pytest.approx(np.nan, nan_ok=True)]
    assert per_second(np.zeros(0), np.zeros(0), 0.0, 2).shape == (1, 2)
    has = np.array([[True, False, False, True, False, False, False, False]])
    assert hold_short_holes(has, 2).tolist() == [[False, True, True] + [False] * 5]
    assert rolling_mean(np.array([[1.0, np.nan, 3.0]]), 3).tolist() == [[1.0, 2.0, 3.0]]
    gone = np.ones((2, 60), dtype=bool)
    gone[1, 10:50] = False
    assert lost_runs(gone, 30).sum() == 40 and lost_runs(gone[:1], 30).sum() == 0
    assert goodput_ratio(np.zeros(len(STATES))) is None
    ledger = account(np.full((2, 5), np.nan), weights=np.ones(5))
    assert _states(ledger) == {"unknown": 10.0}


# ------------------------------------------------------------------ synthetic truth


@pytest.mark.parametrize("seed", TUNING_SEEDS)
def test_each_state_within_5_percent_of_the_truth(seed, tmp_path):
    story = draw_story(seed)
    acc = _accounting(story, tmp_path)
    want = truth(story)
    for state in STATES:
        got, true = acc["seconds"][state], want["seconds"][state]
        assert got == pytest.approx(true, rel=0.05, abs=0.5), state
    assert sum(acc["seconds"].values()) == pytest.approx(want["duration"], abs=1.0)
    lost = acc["lost_progress_estimate"]
    assert lost["failures"] == 1 and "estimate" in lost["note"]
    assert lost["gpu_seconds"] == pytest.approx(want["lost_progress_gpu_seconds"], rel=0.1)


def test_goodput_falls_as_checkpoints_come_more_often(tmp_path):
    ratios = [_accounting(checkpoint_every(n), tmp_path)["goodput_ratio"]
              for n in (1000, 100, 10, 1)]
    assert ratios == sorted(ratios, reverse=True) and len(set(ratios)) == 4
    assert ratios[0] > 0.95 and ratios[-1] < 0.5


def test_analyze_json_and_text_carry_the_account(tmp_path):
    path = write_trace(draw_story(6), tmp_path / "job.cte")
    out = subprocess.run([*CLI, "analyze", str(path), "--format", "json"], capture_output=True,
                         text=True, check=True).stdout
    rep = json.loads(out)
    acc = rep["time_accounting"]
    assert set(acc["seconds"]) == set(STATES)
    assert sum(acc["seconds"].values()) == pytest.approx(rep["duration_seconds"], abs=0.01)
    assert 0 < acc["goodput_ratio"] < 1
    text = subprocess.run([*CLI, "analyze", str(path)], capture_output=True, text=True,
                          check=True).stdout
    assert "goodput ratio (productive / held)" in text and "estimated" in text
