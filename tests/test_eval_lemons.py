"""scripts/eval_lemons.py's pieces: ties at the cut, the references, the fits, the rolling
origins and the choice, and that what ships is what it chooses."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from exporter.analysis.lemons import KIND_WEIGHTS, NAME, TAU_DAYS, Model
from exporter.events import Event
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


def _start(node, day, hardware=True, gpu=True):
    return ev.Start(node, EPOCH + day * DAY, hardware, gpu)


def test_the_references_count_what_they_say():
    starts = [_start("n", d) for d in (1, 2, 3, 4, 5)] + [
        _start("m", 1, hardware=False, gpu=False)]
    starts = [_start("old", -100)] + sorted(starts, key=lambda s: s.time)
    got = ev.baselines(starts, EPOCH + 6 * DAY)
    assert got["ref: faults in 30 d (all)"] == {"n": 5, "m": 1}
    assert got["ref: faults in 30 d (Hardware Failure)"] == {"n": 5}
    assert got["ref: faults in 30 d (GPU class)"] == {"n": 5}
    assert got["ref: lifetime faults"] == {"n": 5, "m": 1, "old": 1}
    assert got["ref: hardware faults, decayed 14 d"]["n"] == pytest.approx(
        sum(np.exp(-(6 - d) / 14) for d in (1, 2, 3, 4, 5)))
    # a start at or after t is not seen
    assert ev.baselines(starts, EPOCH + 1 * DAY)["ref: lifetime faults"] == {"old": 1}


def _fault(node, day, start=True):
    return Fault(node, EPOCH + day * DAY, start, "Hardware Failure", "GPU", "x")


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
        days.append(ev.Day(d, [f"n{i}" for i in range(nodes)], hw, episodes,
                           episodes[:, :, 0].sum(axis=0)))
    return days


def test_the_poisson_fit_finds_the_kind_that_foretells_faults():
    days = _days(np.random.default_rng(7), (0.3, 0.02, 0.0))
    w = ev.fit_poisson(days, np.inf, [(k,) for k in ev.KIND_LIST], iterations=1000)
    assert 0.2 < w[0] < 0.4 and w[1] < 0.06 and w[2] < 0.02
    assert np.isnan(w[5])  # a kind the days never show: nothing measured it


def test_a_kind_with_few_episodes_is_pulled_to_its_group_and_an_unseen_one_takes_it():
    days = _days(np.random.default_rng(3), (0.3, 0.0))  # two kinds of the gpu group
    first, second = ev.KIND_LIST[:2]
    own = ev.fit_kinds(days, np.inf, 0.0)
    pulled = ev.fit_kinds(days, np.inf, 1e6)  # a prior far stronger than the days
    group = ev.fit_groups(days, np.inf)
    assert own.weight(first) > 0.2 and own.weight(second) < 0.02
    assert pulled.weight(first) == pytest.approx(group.weight(first), rel=0.01)
    assert pulled.weight(second) == pytest.approx(group.weight(first), rel=0.01)
    unseen = [k for k in ev.KIND_LIST[2:] if ev.GROUP_OF[k] == ev.GROUP_OF[first]]
    assert {own.weight(k) for k in unseen} == {group.weight(first)}
    assert all(own.weight(k) == 0 for k in ev.KIND_LIST if ev.GROUP_OF[k] != "gpu")


def test_each_origin_fits_on_the_days_whose_labels_end_before_it_and_judges_the_next_7():
    days = _days(np.random.default_rng(1), (0.3,), n_days=90)
    seen = []

    def fit(training):
        seen.append([d.day for d in training])
        return Model(np.inf, {ev.KIND_LIST[0]: 1.0})

    (result,) = ev.judge(days, [ev.Candidate("c", 1, fit=fit)], [60, 67, 74])
    assert [s[-1] for s in seen] == [53, 60, 67] and all(s[0] == 0 for s in seen)
    assert result.per_origin.shape == (3, len(ev.KS))
    # judged on days 60-66 alone: the same figure as precision over those days
    alone = ev.precision(days[60:67], lambda d: ev.model_scores(d, fit([])))
    assert np.allclose(result.per_origin[0], alone)


def test_the_simplest_candidate_within_the_best_ones_spread_is_chosen():
    simple = ev.Candidate("simple", 0, Model(np.inf, {"xid": 1.0}))
    rich = ev.Candidate("rich", 5, Model(7.0, {"xid": 1.0}))
    custom = ev.Candidate("custom", 0, custom=lambda d: d.hw)  # the rules cannot compute it
    # the best: P@2 0.2 ± 0.14, P@5 0.15 ± 0.07
    noisy = np.array([[0.3, 0.2, 0.1], [0.1, 0.1, 0.1]])
    results = [ev.Result("simple", np.array([[0.1, 0.1, 0.1], [0.1, 0.08, 0.1]])),
               ev.Result("rich", noisy), ev.Result("custom", noisy + 0.5)]
    assert ev.choose(results, [simple, rich, custom]) is simple
    # the richer one wins by more than its spread at 5: it is chosen
    results[1] = ev.Result("rich", np.array([[0.3, 0.4, 0.1], [0.3, 0.4, 0.1]]))
    assert ev.choose(results, [simple, rich, custom]) is rich


def test_a_fleets_own_events_label_hardware_faults_by_kind_and_xid_action():
    t = 1_000 * DAY
    events = [Event(t, "a", "xid", "0", 13), Event(t + 1, "a", "xid", "0", 79),
              Event(t + 2, "b", "ib_link_down"), Event(t + 3, "c", "software"),
              Event(t + 4, "d", "xid")]
    fleet = ev.fleet_of_events(events, 10)
    assert [(s.node, s.hardware, s.gpu) for s in fleet.starts] == [
        ("a", True, True), ("b", True, False), ("c", False, False), ("d", True, True)]
    assert [e.xid for e in fleet.events if e.node == "a"] == [79]  # XID 13: the application's
    assert fleet.epoch == t and fleet.servers == 10


@pytest.mark.skipif(not FAULT_TRACE.exists(), reason="shared/data is not beside the checkout")
def test_the_shipped_score_is_what_the_rolling_origins_choose():
    days = ev.build_days(ev.load(str(FAULT_TRACE), None))
    select = [o for o in ev.origins(days) if o <= ev.SELECTION_LAST]
    assert select[0] == 60 and select[-1] == 151
    cands = ev.candidates()
    chosen = ev.choose(ev.judge(days, cands, select), cands)
    assert ev.fit_shipped(days, chosen) == Model(TAU_DAYS, dict(KIND_WEIGHTS))
    assert chosen.name == NAME
    # the shipped row goes through the command's code: the same ranking as the candidate's
    day = days[100]
    assert np.array_equal(day.scores[ev.SHIPPED] > 0, ev.model_scores(day, Model()) > 0)
