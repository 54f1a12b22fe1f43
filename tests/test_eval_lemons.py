"""scripts/eval_lemons.py's pieces: ties at the cut, the baselines, the weight fit."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from exporter.analysis.lemons import KIND_WEIGHTS, TAU_DAYS
from exporter.offline.infinitehbd import DAY, EPOCH, Fault
from tests.test_lemons import FAULT_TRACE
from tests.tools import REPO

_spec = importlib.util.spec_from_file_location("eval_lemons", REPO / "scripts" / "eval_lemons.py")
ev = importlib.util.module_from_spec(_spec)
sys.modules["eval_lemons"] = ev  # its dataclasses look their module up
_spec.loader.exec_module(ev)


def test_a_tie_at_the_cut_is_shared_as_a_random_tie_break_would_on_average():
    scores = {"a": 3.0, "b": 2.0, "c": 2.0, "d": 2.0, "e": 2.0, "quiet": 0.0}
    eligible = list(scores)
    # top 3: a, then 2 of the 4 tied; one of the tied is positive: expected 0.5 of a hit
    s = np.array([scores[n] for n in eligible])

    def pos(*names):
        return np.array([n in names for n in eligible], float)

    assert ev._top(s, pos("c"), 3) == (3.0, 0.5)
    assert ev._top(s, pos("a"), 3) == (3.0, 1.0)
    # fewer scoring above 0 than k: only those are raised
    assert ev._top(s, pos("quiet"), 10) == (5.0, 0.0)
    assert ev._top(np.array([2.0]), np.array([1.0]), 2) == (1.0, 1.0)


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


def _days(rng, foretell, n_days=60, nodes=300):
    """Synthetic days: episodes of the first kinds at random, faults to come at
    0.002 + sum_k foretell[k] x episodes of kind k (all 0-1 d old)."""
    days = []
    for d in range(n_days):
        episodes = np.zeros((nodes, len(ev.KIND_LIST), len(ev.SEGMENTS)))
        episodes[:, :len(foretell), 0] = rng.poisson(0.2, size=(nodes, len(foretell)))
        rate = 0.002 + episodes[:, :len(foretell), 0] @ np.array(foretell)
        hw = (rng.random(nodes) < rate).astype(float)
        days.append(ev.Day(d, [f"n{i}" for i in range(nodes)], hw, hw, episodes))
    return days


def test_the_poisson_fit_finds_the_kind_that_foretells_faults():
    days = _days(np.random.default_rng(7), (0.3, 0.02, 0.0))
    w = ev.fit_poisson(days, np.inf, "kind", iterations=1000)
    assert 0.2 < w[0] < 0.4 and w[1] < 0.06 and w[2] < 0.02
    assert np.isnan(w[5])  # a kind the days never show: nothing measured it


def test_a_kind_the_days_never_show_takes_its_groups_pooled_weight():
    days = _days(np.random.default_rng(3), (0.3,))  # only the first kind (xid) has episodes
    weights = ev.fit_kind_weights(days, np.inf)
    first = ev.KIND_LIST[0]
    assert 0.2 < weights[first] < 0.4
    unseen = [k for k in ev.KIND_LIST[1:] if ev.GROUP_OF[k] == ev.GROUP_OF[first]]
    assert {weights[k] for k in unseen} == {weights[first]}  # its group: only that kind
    assert all(weights[k] == 0 for k in ev.KIND_LIST if ev.GROUP_OF[k] != ev.GROUP_OF[first])


def test_the_shipped_score_is_the_numpy_formula():
    days = _days(np.random.default_rng(5), (0.3, 0.1))
    day = days[0]
    weights = {ev.KIND_LIST[0]: 0.3, ev.KIND_LIST[1]: 0.1}
    got = ev.hawkes_scores(day, np.inf, weights)
    x = day.episodes[:, 0, 0] * 0.3 + day.episodes[:, 1, 0] * 0.1
    assert np.allclose(got, x / (x.sum() / ev.SERVERS))


@pytest.mark.skipif(not FAULT_TRACE.exists(), reason="shared/data is not beside the checkout")
def test_the_shipped_score_is_what_the_evaluation_chooses_fitted_on_every_day():
    days = ev.build_days(ev.load_faults(FAULT_TRACE))
    tuning, held, _ = ev.split_days(days)
    assert tuning[-1].day < held[0].day
    best, weights, _ = ev.choose(tuning)
    assert best.fitted == "kind" and best.tau == TAU_DAYS
    assert weights["ecc_dbe"] > 0 and weights["xid"] == 0  # the tuning days' own fit
    # what ships: the chosen model fitted once more on every scored day
    assert ev.fit_kind_weights(days, best.tau) == {k: KIND_WEIGHTS.get(k, 0.0)
                                                   for k in ev.KIND_LIST}
