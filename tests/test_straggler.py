"""Straggler and stall analysis on synthetic nodes with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from exporter.analysis.stalls import StallThresholds, compute_level, detect_stall
from exporter.analysis.straggler import (
    SIGNALS,
    StragglerDetector,
    StragglerThresholds,
    modified_z,
    window_features,
)
from exporter.analysis.straggler_scan import scan
from exporter.sampling.settings import StragglerSettings

T0 = 1_758_000_000.0
FS = 4.0  # samples per second
N = 8


def simulate(minutes: float = 30.0, *, seed: int = 0, slow: int | None = None,
             cap: int | None = None, hot: int | None = None, hot_delta: float = 15.0,
             checkpoint_every: float | None = None, checkpoint_seconds: float = 15.0,
             n: int = N) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A synchronous data-parallel job: each step every GPU computes, then all
    wait in the all-reduce until the slowest is done (busy-waiting at 100 %
    utilization and ~200 W).  Static per-GPU temperature offsets of +/-3 degC,
    power noise 10 W, clock noise 15 MHz.

    slow: that GPU's SM clock is 15 % lower (thermal), so its compute phase is
    1/0.85 longer at lower power and everyone else waits longer.
    cap: that GPU's power limit is 450 W: compute at 450 W, clock -20 %, SW
    power cap bit (0x4) while computing.
    hot: that GPU runs ``hot_delta`` degC hotter, nothing else.
    checkpoint_every: rank 0 stops for ``checkpoint_seconds`` (0 % util, 100 W)
    while the others busy-wait at 100 % util and ~150 W.
    """
    rng = np.random.default_rng(seed)
    t = T0 + np.arange(int(minutes * 60 * FS)) / FS
    rel = t - T0
    compute = np.full(n, 1.4)
    p_comp = np.full(n, 650.0)
    clock = np.full(n, 1.98e9)
    if slow is not None:
        compute[slow] /= 0.85
        p_comp[slow] = 585.0
        clock[slow] *= 0.85
    if cap is not None:
        compute[cap] /= 0.8
        p_comp[cap] = 450.0
        clock[cap] *= 0.8
    period = compute.max() + 0.4
    comp = (rel % period)[None, :] < compute[:, None]
    power = np.where(comp, p_comp[:, None], 200.0) + rng.normal(0, 10, (n, t.size))
    util = 1.0 - np.abs(rng.normal(0, 0.005, (n, t.size)))
    clk = np.where(comp, clock[:, None], 1.98e9) + rng.normal(0, 15e6, (n, t.size))
    temp = 62 + rng.uniform(-3, 3, n)[:, None] + rng.normal(0, 0.5, (n, t.size))
    reasons = np.zeros((n, t.size))
    if cap is not None:
        reasons[cap] = np.where(comp[cap], 0x4, 0)
    if hot is not None:
        temp[hot] += hot_delta
    if checkpoint_every:
        ck = (rel % checkpoint_every) >= checkpoint_every - checkpoint_seconds
        util[0, ck] = 0.0
        power[0, ck] = 100 + rng.normal(0, 3, ck.sum())
        power[1:, ck] = 150 + rng.normal(0, 5, (n - 1, ck.sum()))
    return t, {"power": power, "utilization": util, "sm_clock": clk,
               "temperature": temp, "clock_event_reasons": reasons}


def scan_settings(**kw: object) -> dict[str, object]:
    """scan's windows and thresholds as analyze passes them: the straggler settings'
    (their defaults), with `kw` in their place."""
    st = StragglerSettings()
    return {"window_seconds": st.window_seconds, "step_seconds": st.update_seconds,
            "thresholds": st.thresholds(), "stall_window_seconds": st.stall_window_seconds,
            "stall_context_seconds": st.stall_context_seconds, **kw}


def run_scan(t: np.ndarray, d: dict[str, np.ndarray], **kw: object):
    d = dict(d)
    return scan(t, d.pop("power"), **d, **scan_settings(**kw))  # type: ignore[arg-type]


def flagged(res) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for o in res.outliers:
        out.setdefault(o.gpu, set()).add(o.signal)
    return out


# --------------------------------------------------------------------------- scenarios


def test_thermally_throttled_gpu_is_flagged_by_sm_clock_only() -> None:
    t, d = simulate(slow=3)
    d.pop("clock_event_reasons")  # the scenario's point: clocks alone show it
    res = run_scan(t, d)
    got = flagged(res)
    assert set(got) == {3}
    assert "sm_clock" in got[3] and got[3] <= {"sm_clock", "duty_cycle"}
    clk = next(o for o in res.outliers if o.signal == "sm_clock")
    assert clk.direction == "low" and clk.score < -3.5
    assert clk.start == pytest.approx(T0) and clk.end == pytest.approx(t[-1])
    duty = [o for o in res.outliers if o.signal == "duty_cycle"]
    assert all(o.direction == "high" for o in duty)  # it computes longer
    assert res.stalls == []


def test_power_capped_gpu() -> None:
    t, d = simulate(cap=5)
    res = run_scan(t, d)
    got = flagged(res)
    assert set(got) == {5}
    assert {"power", "sm_clock", "throttle"} <= got[5] <= {"power", "sm_clock", "throttle",
                                                           "duty_cycle"}
    dirs = {o.signal: o.direction for o in res.outliers}
    assert dirs["power"] == "low" and dirs["sm_clock"] == "low" and dirs["throttle"] == "high"


def test_hot_gpu_flags_temperature_only() -> None:
    t, d = simulate(hot=2)
    res = run_scan(t, d)
    assert flagged(res) == {2: {"temperature"}}
    assert res.outliers[0].direction == "high"
    assert res.stalls == []


def test_checkpoint_stall_names_rank_0() -> None:
    t, d = simulate(checkpoint_every=120.0)
    res = run_scan(t, d)
    assert len(res.stalls) == 15  # one per 2 minutes over 30 minutes
    for k, s in enumerate(res.stalls):
        true_start = T0 + 120 * (k + 1) - 15
        assert s.culprit_gpus == (0,)
        assert s.waiting_gpus == tuple(range(1, N))
        assert s.start == pytest.approx(true_start, abs=1.0)
        assert s.end == pytest.approx(true_start + 15, abs=1.0)
    # a periodic 15 s pause never lasts 5 minutes: not a straggler
    assert res.outliers == []


def test_healthy_node_yields_nothing_but_would_with_the_gates_off() -> None:
    t, d = simulate(seed=7)
    res = run_scan(t, d)
    assert res.peer_statistics
    assert res.outliers == [] and res.stalls == []
    assert res.windows > 150
    # the same data with no effect gate, no MAD floor, a low z and no
    # persistence does flag GPUs: the gates are what keeps the node clean
    loose = StragglerThresholds(z=1.0, min_effect_ratio=0.0, min_abs_effect={},
                                mad_floor_ratio=0.0, mad_epsilon={},
                                persistence_seconds=0.0)
    assert run_scan(t, d, thresholds=loose).outliers


def _temperature_window(temps: list[float]) -> object:
    t = np.arange(60.0)
    return window_features(t, np.full((len(temps), t.size), 400.0),
                           temperature=np.array(temps)[:, None] + 0 * t)


@pytest.mark.parametrize(
    ("temps", "loosened", "why"),
    [
        # tight peers, GPU 7 only 4 degC (7 %) warmer: |M| > 3.5, the effect is too small
        ([60.0, 60.1, 59.9, 60.0, 60.1, 59.9, 60.0, 64.0], {"min_effect_ratio": 0.0}, "effect"),
        # peers spread 42-58 degC (airflow), GPU 7 +15 degC (+29 %): passes the
        # effect gate but M ~ 2.3 is no outlier (the real H100 trace's GPU 1)
        ([42.0, 45.0, 48.0, 50.0, 52.0, 55.0, 58.0, 66.0], {"z": 2.0}, "z"),
    ],
)
def test_each_gate_alone_keeps_a_gpu_unflagged(temps: list[float], loosened: dict[str, float],
                                               why: str) -> None:
    f = _temperature_window(temps)
    strict = StragglerDetector(StragglerThresholds(persistence_seconds=0)).update(f)
    sc = strict.gpus[7].scores["temperature"]
    assert not sc.deviating and strict.outliers == ()
    assert (abs(sc.score) > 3.5) == (why == "effect")
    loose = StragglerDetector(StragglerThresholds(persistence_seconds=0, **loosened)).update(f)
    assert [(x.gpu, x.signal) for x in loose.outliers] == [(7, "temperature")]


def test_two_minute_deviation_is_not_an_outlier_at_five_minutes() -> None:
    """GPU 4 is 15 degC hotter for 2 minutes, and later for 7 minutes."""
    det = StragglerDetector(StragglerSettings().thresholds())  # 5 minutes
    rng = np.random.default_rng(1)
    t = np.arange(60.0)  # one 60 s window, 1 Hz
    history = []
    for step in range(120):  # one update every 10 s, 20 minutes
        now = 60.0 + 10 * step
        temp = 60 + rng.normal(0, 0.3, (N, t.size))
        if 120 <= now < 240 or 600 <= now < 1020:
            temp[4] += 15
        f = window_features(now - 60 + t, np.full((N, t.size), 400.0), temperature=temp)
        history.append((now, det.update(f, t=now)))
    for now, rep in history:
        g4 = rep.gpus[4]
        if now < 600:
            assert not g4.straggler and rep.outliers == ()
        deviating = 120 <= now < 240 or 600 <= now < 1020
        assert g4.scores["temperature"].deviating == deviating
        if 600 + 300 <= now < 1020:
            assert g4.straggler and g4.signals == ("temperature",)
            assert g4.since == 600 and rep.outliers[0].direction == "high"
        elif now >= 1020:
            assert not g4.straggler and g4.scores["temperature"].since is None
        assert all(not rep.gpus[g].straggler for g in range(N) if g != 4)


def test_scan_persistence_flag() -> None:
    t, d = simulate(minutes=10, hot=1)
    assert flagged(run_scan(t, d)) == {1: {"temperature"}}
    assert run_scan(t, d, thresholds=StragglerThresholds(persistence_seconds=900)).outliers == []


# --------------------------------------------------------------------------- statistics edge cases


def test_modified_z_mad_zero_and_median_zero() -> None:
    with np.errstate(all="raise"):
        s, med, mad = modified_z(np.zeros(8))
        assert med == 0 and mad > 0 and np.all(s == 0)
        s, med, mad = modified_z(np.array([60.0] * 7 + [75.0]))
        assert med == 60 and mad == pytest.approx(0.6)  # 1 % of the median
        assert s[-1] == pytest.approx(0.6745 * 15 / 0.6) and np.all(s[:7] == 0)
        s, med, mad = modified_z(np.array([np.nan, 1.0, 2.0, 3.0]))
        assert math.isnan(s[0]) and med == 2 and mad == 1
    s, med, mad = modified_z(np.array([np.nan, np.nan]))
    assert np.isnan(s).all() and math.isnan(med)


def test_detector_with_mad_zero_flags_only_the_different_gpu() -> None:
    det = StragglerDetector(StragglerThresholds(persistence_seconds=0))
    t = np.arange(10.0)
    temp = np.full((N, t.size), 60.0)
    temp[6] = 75.0
    with np.errstate(all="raise"):
        # power, clocks, utilization all identical (MAD 0); throttle all 0 (median 0)
        rep = det.update(window_features(t, np.full((N, t.size), 300.0), temperature=temp,
                                         sm_clock=np.full((N, t.size), 1.98e9),
                                         utilization=np.ones((N, t.size)),
                                         clock_event_reasons=np.zeros((N, t.size))))
    assert [(f.gpu, f.signal, f.direction) for f in rep.outliers] == [(6, "temperature", "high")]
    for g in range(N):
        for sig in ("power", "sm_clock", "utilization", "throttle"):
            assert rep.gpus[g].scores[sig].score == 0
    assert math.isnan(rep.gpus[0].scores["nvlink"].score)  # not given: not compared


@pytest.mark.parametrize("n", [1, 2])
def test_tiny_node_has_no_peer_statistics(n: int) -> None:
    t = np.arange(60.0)
    power = np.full((n, t.size), 650.0)
    power[0] = 100.0
    temp = np.full((n, t.size), 40.0)
    temp[-1] = 90.0
    det = StragglerDetector(StragglerThresholds(persistence_seconds=0))
    with np.errstate(all="raise"):
        rep = det.update(window_features(t, power, temperature=temp,
                                         utilization=np.ones((n, t.size))))
    assert not rep.peer_statistics and rep.outliers == ()
    assert "at least 3" in (rep.reason or "")
    for g in range(n):
        assert not rep.gpus[g].peer_statistics and not rep.gpus[g].straggler
        assert all(math.isnan(s.score) for s in rep.gpus[g].scores.values())
    tt = T0 + np.arange(0, 900, 0.5)
    pw = np.full((n, tt.size), 650.0)
    pw[0] = 150.0
    res = scan(tt, pw, utilization=np.ones((n, tt.size)), temperature=np.full((n, tt.size), 40.0),
               **scan_settings(thresholds=StragglerThresholds(persistence_seconds=0)))
    assert res.outliers == [] and res.stalls == [] and not res.peer_statistics
    assert "at least 3" in (res.reason or "")


def test_groups_compare_only_within_a_job() -> None:
    """GPUs 6 and 7 run another, lighter job: against the node they look like
    stragglers; within their own job (too small for statistics) they are not."""
    t = np.arange(60.0)
    power = np.full((N, t.size), 650.0) + np.arange(N)[:, None]
    power[6:] = 300.0
    f = window_features(t, power)
    th = StragglerThresholds(persistence_seconds=0)
    node = StragglerDetector(th).update(f)
    assert {x.gpu for x in node.outliers} == {6, 7}
    jobs = {g: ("train" if g < 6 else "eval") for g in range(N)}
    rep = StragglerDetector(th).update(f, groups=jobs)
    assert rep.outliers == () and rep.peer_statistics
    by_group = {s.group: s for s in rep.groups}
    assert by_group["train"].peer_statistics and by_group["train"].gpus == tuple(range(6))
    assert not by_group["eval"].peer_statistics and "eval" in (by_group["eval"].reason or "")
    assert rep.gpus[7].group == "eval" and not rep.gpus[7].peer_statistics


def test_changing_group_restarts_persistence() -> None:
    t = np.arange(60.0)
    temp = np.full((N, t.size), 60.0)
    temp[2] = 80.0
    det = StragglerDetector(StragglerThresholds(persistence_seconds=100))
    f = window_features(t, np.full((N, t.size), 400.0), temperature=temp)
    assert not det.update(f, t=0).gpus[2].straggler
    assert det.update(f, t=100).gpus[2].straggler
    jobs = {g: "b" for g in range(N)}
    rep = det.update(f, t=110, groups=jobs)
    assert not rep.gpus[2].straggler and rep.gpus[2].scores["temperature"].since == 110


# --------------------------------------------------------------------------- features


def test_window_features_throttle_shares_and_optional_series() -> None:
    t = np.arange(10.0)
    power = np.full((3, 10), 300.0)
    reasons = np.zeros((3, 10))
    reasons[1, :5] = 0x4 | 0x1  # SW power cap (and idle, which is no throttle)
    reasons[2, :2] = 0x40
    reasons[2, 2:4] = 0x1  # idle only
    reasons[0, :] = np.nan
    clk_t = np.arange(0, 10, 2.0)  # clocks at their own rate
    f = window_features(t, power, gpus=[4, 5, 6], clock_event_reasons=reasons,
                        sm_clock=(clk_t, np.full((3, clk_t.size), 1.5e9)),
                        nvlink=np.full((3, 10), 2e9))
    assert list(f.gpus) == [4, 5, 6]
    assert math.isnan(f.gpus[4].throttle_ratio) and f.gpus[4].throttle_reasons == {}
    assert f.gpus[5].throttle_ratio == pytest.approx(0.5)
    assert f.gpus[5].throttle_reasons["sw_power_cap"] == pytest.approx(0.5)
    assert f.gpus[6].throttle_ratio == pytest.approx(0.2)
    assert f.gpus[6].throttle_reasons["hw_thermal_slowdown"] == pytest.approx(0.2)
    assert f.gpus[6].throttle_reasons["sw_thermal_slowdown"] == 0
    assert f.gpus[5].sm_clock_hertz == 1.5e9 and f.gpus[5].nvlink_bytes_per_second == 2e9
    assert math.isnan(f.gpus[5].temperature_celsius) and math.isnan(f.gpus[5].pcie_bytes_per_second)
    assert not f.phases and math.isnan(f.gpus[5].duty_cycle)  # flat node: no phases


def test_the_drivers_throttle_counters_win_over_sampled_bits() -> None:
    """A 2 s step read at 1 Hz: the bits show GPU 0 capped at every read and the others
    never, though all four are capped 20 % of the time, as the driver's counters say.
    With the counters the share is the same for all; the reasons they do not count still
    come from the bits; a GPU without two readings, or whose counter went back, keeps
    its bits."""
    t = np.arange(60.0)
    power = np.full((4, 60), 600.0)
    reasons = np.zeros((4, 60))
    reasons[0] = 0x4  # SW power cap at every read of GPU 0: its phase of the step
    reasons[1, :6] = 0x80  # HW power brake, which has no sweep-rate counter
    counters = np.outer(np.ones(4), 0.2 * t)  # 0.2 s of cap per second, every GPU
    counters[2, 1:] = np.nan  # one reading
    counters[3, 30:] -= 10.0  # reset
    reasons[2:, :12] = 0x4
    thermal = np.outer(np.ones(4), 0.05 * t)  # and 0.05 s of SW thermal slowdown
    seconds = {"sw_power_cap": (t, counters), "sw_thermal_slowdown": (t, thermal)}
    f = window_features(t, power, clock_event_reasons=reasons, throttle_seconds=seconds)
    assert f.gpus[0].throttle_ratio == pytest.approx(0.25)  # not 1.0
    assert f.gpus[1].throttle_ratio == pytest.approx(0.25 + 0.1)
    assert f.gpus[2].throttle_ratio == f.gpus[3].throttle_ratio == pytest.approx(0.2)  # bits
    # each counted reason's share from its own counter (shown on the live page)
    assert f.gpus[0].throttle_reasons["sw_power_cap"] == pytest.approx(0.2)  # bits: 1.0
    assert f.gpus[0].throttle_reasons["sw_thermal_slowdown"] == pytest.approx(0.05)
    assert f.gpus[1].throttle_reasons["hw_power_brake_slowdown"] == pytest.approx(0.1)
    assert f.gpus[2].throttle_reasons["sw_power_cap"] == pytest.approx(0.2)  # bits: 12/60
    assert f.gpus[3].throttle_reasons["sw_power_cap"] == pytest.approx(0.2)  # bits too
    without = window_features(t, power, clock_event_reasons=reasons)
    assert without.gpus[0].throttle_ratio == 1.0
    assert without.gpus[0].throttle_reasons["sw_power_cap"] == 1.0
    # a counter of one reason alone: the total from the bits, that reason exact
    one = window_features(t, power, clock_event_reasons=reasons,
                          throttle_seconds={"sw_power_cap": (t, counters)})
    assert one.gpus[0].throttle_ratio == 1.0
    assert one.gpus[0].throttle_reasons["sw_power_cap"] == pytest.approx(0.2)


def test_duty_cycle_only_with_phases() -> None:
    t = np.arange(0, 60, 0.25)
    high = (t % 2) < 1.5
    power = np.where(high, 650.0, 200.0) * np.ones((N, 1))
    power[3] = np.where((t % 2) < 1.75, 600.0, 200.0)  # computes longer, at lower power
    f = window_features(t, power)
    assert f.phases
    assert f.gpus[0].duty_cycle == pytest.approx(0.75)
    assert f.gpus[3].duty_cycle == pytest.approx(0.875)
    # a flat node whose GPUs differ by static offsets has no duty cycle to compare
    flat = window_features(t, 400 + 5 * np.arange(N)[:, None] + 0 * t)
    assert not flat.phases and all(math.isnan(g.duty_cycle) for g in flat.gpus.values())


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="unknown signals"):
        StragglerDetector(StragglerSettings().thresholds(), signals=("power", "fan"))
    with pytest.raises(ValueError, match="samples per GPU"):
        window_features(np.arange(5.0), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="temperature"):
        window_features(np.arange(5.0), np.zeros((2, 5)), temperature=np.zeros((3, 5)))
    assert set(SIGNALS) == {"sm_clock", "power", "temperature", "utilization", "duty_cycle",
                            "throttle", "nvlink", "pcie", "compute"}


# --------------------------------------------------------------------------- stall signature


def test_detect_stall_single_window() -> None:
    level = np.full(N, 650.0)
    util = np.ones(N)
    power = np.full(N, 150.0)
    # everyone busy-waits: no culprit on this node, no stall reported
    assert not detect_stall(util, power, level).stalled
    # rank 0 idle (checkpoint): the culprit
    u0 = util.copy()
    u0[0] = 0.0
    p0 = power.copy()
    p0[0] = 90.0
    r = detect_stall(u0, p0, level)
    assert r.stalled and r.culprit_gpus == (0,) and r.waiting_gpus == tuple(range(1, N))
    # rank 0 still computing at high power (the real H100 trace at 466 s)
    p1 = power.copy()
    p1[0] = 690.0
    r = detect_stall(util, p1, np.full(N, 690.0))
    assert r.stalled and r.culprit_gpus == (0,)
    # all computing: no stall
    assert not detect_stall(util, np.full(N, 640.0), level).stalled
    # the idle GPU belongs to another job: no culprit in the waiting job
    jobs = {g: ("a" if g else "b") for g in range(N)}
    assert not detect_stall(u0, p0, level, groups=jobs).stalled
    # ambiguous GPU (70 % of its level, busy): neither waiting nor culprit
    p2 = power.copy()
    p2[0] = 0.7 * 650
    assert not detect_stall(util, p2, level).stalled
    # too few waiters for the share
    th = StallThresholds(min_waiting_share=0.9)
    assert not detect_stall(u0, p0, level, thresholds=th).stalled


def test_detect_stall_tiny_and_nan() -> None:
    with np.errstate(all="raise"):
        r = detect_stall(np.array([1.0, 0.0]), np.array([150.0, 90.0]), np.array([650.0, 650.0]))
    assert not r.stalled  # one waiting GPU is not enough
    r = detect_stall(np.array([1.0, 1.0, np.nan]), np.array([150.0, 150.0, np.nan]),
                     np.array([650.0, 650.0, np.nan]))
    assert not r.stalled  # nothing known about the third: no culprit
    lv = compute_level(np.array([[100.0] * 19 + [700.0], [np.nan] * 20]))
    assert lv[0] == pytest.approx(100 + 0.05 * 600) and math.isnan(lv[1])


def test_a_flip_from_hot_to_cold_restarts_persistence() -> None:
    """GPU 4 is 15 degC hot for 3 minutes, then 15 degC cold for 6: the hot spell is never a
    outlier, the cold one is held as low from its own start and is one after 5 minutes."""
    det = StragglerDetector(StragglerSettings().thresholds())  # 5 minutes
    rng = np.random.default_rng(2)
    t = np.arange(60.0)
    history = []
    for step in range(72):  # one update every 10 s, 12 minutes
        now = 60.0 + 10 * step
        temp = 60 + rng.normal(0, 0.3, (N, t.size))
        if 120 <= now < 300:
            temp[4] += 15
        elif 300 <= now < 660:
            temp[4] -= 15
        f = window_features(now - 60 + t, np.full((N, t.size), 400.0), temperature=temp)
        history.append((now, det.update(f, t=now)))
    for now, rep in history:
        g4 = rep.gpus[4].scores["temperature"]
        if 120 <= now < 300:
            assert (g4.deviating, g4.direction, g4.since) == (True, "high", 120), now
        elif 300 <= now < 660:
            assert (g4.deviating, g4.direction, g4.since) == (True, "low", 300), now
        if 300 + 300 <= now < 660:
            assert rep.gpus[4].straggler and g4.outlier, now
            (outlier,) = rep.outliers
            assert (outlier.gpu, outlier.direction, outlier.since) == (4, "low", 300)
        else:
            assert not rep.gpus[4].straggler and rep.outliers == (), now
