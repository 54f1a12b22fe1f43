"""scripts/eval_lemons.py's pieces: ties at the cut, the baselines, the weight fit."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from exporter.offline.infinitehbd import DAY, EPOCH, Fault
from tests.tools import REPO

_spec = importlib.util.spec_from_file_location("eval_lemons", REPO / "scripts" / "eval_lemons.py")
ev = importlib.util.module_from_spec(_spec)
sys.modules["eval_lemons"] = ev  # its dataclasses look their module up
_spec.loader.exec_module(ev)


def test_a_tie_at_the_cut_is_shared_as_a_random_tie_break_would_on_average():
    scores = {"a": 3.0, "b": 2.0, "c": 2.0, "d": 2.0, "e": 2.0, "quiet": 0.0}
    eligible = list(scores)
    # top 3: a, then 2 of the 4 tied; one of the tied is positive: expected 0.5 of a hit
    assert ev._top(scores, eligible, {"c"}, 3) == (3.0, 0.5)
    assert ev._top(scores, eligible, {"a"}, 3) == (3.0, 1.0)
    # fewer scoring above 0 than k: only those are raised
    assert ev._top(scores, eligible, {"quiet"}, 10) == (5.0, 0.0)
    assert ev._top(scores, ["b"], {"b"}, 2) == (1.0, 1.0)


def _fault(node, day, start=True, level="Hardware Failure", cls="GPU"):
    return Fault(node, EPOCH + day * DAY, start, level, cls, "x")


def test_the_baselines_count_what_they_say():
    faults = [_fault("n", d) for d in (1, 2, 3, 4, 5)] + [
        _fault("m", 1, level="Other Failure", cls="Unknown Error"), _fault("old", -100)]
    got = ev.baselines(faults, EPOCH + 6 * DAY)
    assert got["MultipleRemediations (>= 5 in 7 d)"] == {"n": 1.0}
    assert got["faults in 30 d (all)"] == {"n": 5, "m": 1}
    assert got["faults in 30 d (hardware)"] == {"n": 5}
    assert got["faults in 30 d (GPU)"] == {"n": 5}
    assert got["lifetime faults"] == {"n": 5, "m": 1, "old": 1}
    assert got["hardware, decayed 14 d"]["n"] == pytest.approx(
        sum(np.exp(-(6 - d) / 14) for d in (1, 2, 3, 4, 5)))
    # a day later the first is 7 days old: 4 in 7 days
    assert ev.baselines(faults, EPOCH + 8 * DAY)["MultipleRemediations (>= 5 in 7 d)"] == {}


def test_a_node_is_in_a_fault_between_its_start_and_its_end():
    faults = [_fault("n", 1), _fault("m", 2), _fault("n", 3, start=False)]  # in time order
    assert ev._in_fault(faults, EPOCH + 2.5 * DAY) == {"n", "m"}
    assert ev._in_fault(faults, EPOCH + 3.5 * DAY) == {"m"}


def test_the_weight_fit_finds_the_group_that_foretells_faults():
    rng = np.random.default_rng(7)
    days = []
    for d in range(60):
        nodes = [f"n{i}" for i in range(200)]
        x = rng.gamma(1.0, 1.0, size=(200, 4))
        rate = 0.02 * x[:, 0] + 0.002 * x[:, 1]  # group 0 foretells, 1 a little, 2-3 not
        hw = {n for n, r in zip(nodes, rate, strict=True) if rng.random() < r}
        day = ev.Day(d, nodes, hw, set(), {})
        day.rates[1.0] = dict(zip(nodes, x, strict=True))
        days.append(day)
    w = ev.fit_weights(days, 1.0, iterations=500)
    assert w[0] == 1.0 and w[1] < 0.4 and w[2] < 0.2 and w[3] < 0.2


def test_the_segment_fit_finds_that_recent_episodes_foretell_more():
    rng = np.random.default_rng(11)
    days = []
    for d in range(60):
        nodes = [f"n{i}" for i in range(300)]
        x = rng.poisson((0.05, 0.3, 1.0), size=(300, 3)).astype(float)  # 0-1, 1-7, 7-28 d
        rate = 0.002 + 0.2 * x[:, 0] + 0.02 * x[:, 1]  # the older 7-28 d: nothing
        hw = {n for n, r in zip(nodes, rate, strict=True) if rng.random() < r}
        day = ev.Day(d, nodes, hw, set(), {})
        day.segments = dict(zip(nodes, x, strict=True))
        days.append(day)
    recent, week, month = ev.fit_segments(days)
    assert recent == 1.0 and 0.03 < week < 0.3 and month < 0.03


def test_a_decay_option_is_a_model_of_the_lemon_score():
    fitted = ev.decay_model(ev.FITTED, 1.0, (1.0, 0.6634, 0.3721))
    assert fitted.segment_weights() == (1.0, 0.663, 0.372) and fitted.spread_floor == 1.0
    assert ev.decay_model(14.0, 0.0).segment_weights()[0] < 1.0
