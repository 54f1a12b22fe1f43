"""Holes in the samples, judged against each analysis' own time scale (analysis.bridging):
a real 8x H100 log with holes punched in as busy hosts leave them, and a synthetic 8-GPU
log with a 68 s checkpoint cycle, offline (`analyze`) and live (PowerMonitor).

The punched cases: (a) 2 s on all GPUs every 5 s through the whole log; (b) 1-3 s at
random on all GPUs, one every ~12 s; (c) 1-3 s at random, at different times on each
GPU; (d) one 60 s hole. What the unpunched log finds must be found again in (a) and (b),
at the same period within 5 % and amplitude within 15 %; (c) finds nothing new; (d) is
named and no window across it is analysed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exporter.analysis.bridging import Bridge, bridge, bridges_for, fill, holes_of
from exporter.commands import analyze
from exporter.sampling.live_power import PowerMonitor
from exporter.sampling.settings import PowerSettings
from tests.punch import at_random, every, punch
from tests.synth_power import T0, _stamp
from tests.tools import REAL_TRACE

needs_real = pytest.mark.skipif(not REAL_TRACE.exists(),
                                reason="shared/data is not beside the checkout")
SPAN = 1350.0  # the real log's length, and a little more


def report(path: Path) -> dict:
    return analyze.analyse_trace(analyze.load_trace(str(path)), analyze.AnalyzeRequest(str(path)))


def _overlap(x: dict, y: dict) -> bool:
    return x["start"] < y["end"] and x["end"] > y["start"]


def _found_again(full: dict, punched: dict) -> None:
    """Every cycle and step period, dip and stall of the unpunched log again in the punched."""
    for s in full["power_swings"]:
        if s["period_seconds"] is None:
            continue
        same = [p for p in punched["power_swings"] if p["scale"] == s["scale"]
                and p["period_seconds"] and _overlap(p, s)
                and p["period_seconds"] == pytest.approx(s["period_seconds"], rel=0.05)]
        assert same, (s, punched["power_swings"])
        assert any(p["node_amplitude_watts"] == pytest.approx(s["node_amplitude_watts"], rel=0.15)
                   for p in same), (s, same)
    for d in full["dips"]:
        assert any(_overlap(p, d) and p["depth_watts"] == pytest.approx(d["depth_watts"], rel=0.15)
                   for p in punched["dips"]), (d, punched["dips"])
    for s in full["stalls"]:
        assert any(_overlap(p, s) and p["culprit_gpus"] == s["culprit_gpus"]
                   for p in punched["stalls"]), (s, punched["stalls"])


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    d = tmp_path_factory.mktemp("punched")
    cases = {
        "a": {"all_gpus": every(5.0, 2.0, SPAN, first=3.0)},
        "b": {"all_gpus": at_random(1, SPAN)},
        "c": {"per_gpu": {g: at_random(10 + g, SPAN) for g in range(8)}},
        "d": {"all_gpus": [(600.0, 660.0)]},
    }
    out = {"full": report(REAL_TRACE)}
    for name, holes in cases.items():
        out[name] = report(punch(REAL_TRACE, d / f"{name}.csv", **holes))
    return out


@needs_real
def test_the_unpunched_log_finds_what_the_punched_ones_are_judged_against(real) -> None:
    full = real["full"]
    assert full["gaps"]["count"] == 0
    cycles = [s for s in full["power_swings"] if s["scale"] == "cycle"]
    assert [round(c["period_seconds"]) for c in cycles] == [22]
    assert len(full["dips"]) == 2 and len(full["stalls"]) == 1


@needs_real
@pytest.mark.parametrize("case", ["a", "b"])
def test_holes_on_all_gpus_hide_nothing_an_analysis_looks_for(real, case: str) -> None:
    rep = real[case]
    assert rep["gaps"]["count"] > 50  # named, each
    assert rep["gaps"]["analyses"]["cycle"]["left_out"] == 0
    assert any("each analysis judges them against its own time scale" in n
               for n in rep["notes"])
    _found_again(real["full"], rep)


@needs_real
def test_holes_on_some_gpus_make_no_stall_dip_or_straggler(real) -> None:
    full, rep = real["full"], real["c"]
    assert rep["gaps"]["count"] > 50
    for name in ("stalls", "dips", "outliers"):
        for found in rep[name]:
            key = "gpu" if name == "outliers" else "start"
            assert any(_overlap(found, f) for f in full[name]), (name, found, key)


@needs_real
def test_one_long_hole_is_named_and_no_window_across_it_is_analysed(real) -> None:
    rep = real["d"]
    assert rep["gaps"]["count"] == 1
    hole = rep["gaps"]["holes"][0]
    assert hole["duration_seconds"] == pytest.approx(60.3, abs=0.5)
    assert all(a["left_out"] == 1 for a in rep["gaps"]["analyses"].values())
    # the goodput account holds the first seconds, the rest of the hole is unknown time
    assert "goodput" in rep["gaps"]["analyses"]
    assert 50 <= rep["time_accounting"]["seconds"]["unknown"] <= 60.3
    assert any(n.startswith("1 gap(s) in the power samples") for n in rep["notes"])
    for found in (*rep["power_swings"], *rep["dips"], *rep["stalls"], *rep["outliers"]):
        assert not _overlap(found, hole), found


# --------------------------------------------------------------------------- synthetic

CHECKPOINT_EVERY, CHECKPOINT_SECONDS = 68.0, 8.0


def checkpoint_power(t: np.ndarray, gpus: int = 8, seed: int = 3) -> np.ndarray:
    """(gpus, len(t)) watts: training at ~600 W, every 68 s an 8 s checkpoint at 150 W."""
    rng = np.random.default_rng(seed)
    saving = (t % CHECKPOINT_EVERY) < CHECKPOINT_SECONDS
    level = np.where(saving, 150.0, 600.0)
    return level + rng.normal(0, 15, (gpus, t.size))


def write_checkpoint_log(path: Path, holes: list[tuple[float, float]]) -> Path:
    """8 GPUs polled by nvidia-smi at 10 Hz for 700 s, without the polls in ``holes``."""
    t = np.arange(0, 700, 0.1)
    watts = checkpoint_power(t)
    lines = ["timestamp, index, power.draw [W]"]
    for i, r in enumerate(t.tolist()):
        if any(a < r < b for a, b in holes):
            continue
        stamp = _stamp(T0 + r)
        lines += [f"{stamp}, {g}, {watts[g, i]:.2f} W" for g in range(8)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_checkpoint_cycle_is_found_through_holes_every_five_seconds(tmp_path: Path) -> None:
    """Nvidia-smi stalls 2 s in every 5 on a busy host: at 10 Hz each hole is 20x the
    typical interval. The 68 s cycle is found as without them."""
    full = report(write_checkpoint_log(tmp_path / "full.csv", []))
    holed = report(write_checkpoint_log(tmp_path / "holed.csv", every(5.0, 2.0, 700, 3.0)))
    cycle = next(s for s in full["power_swings"] if s["scale"] == "cycle")
    assert cycle["period_seconds"] == pytest.approx(CHECKPOINT_EVERY, rel=0.02)
    assert holed["gaps"]["count"] > 100
    _found_again(full, holed)


def test_the_live_cycle_bridges_the_same_holes() -> None:
    """The live monitor's 10-minute cycle window on its 0.2 s grid, NaN in the holes (the
    power buffer's grid): the same cycle as without them."""
    t = np.arange(0, 600, 0.2)
    watts = checkpoint_power(t)
    holed = watts.copy()
    holed[:, (t % 5.0) > 3.0] = np.nan
    times = np.broadcast_to(t, watts.shape)
    found = {}
    for name, w in (("full", watts), ("holed", holed)):
        monitor = PowerMonitor(PowerSettings())
        found[name] = monitor.update(times[:, -300:], w[:, -300:], None, 600.0,
                                     cycle_window=(times, w)).cycle
    full, got = found["full"], found["holed"]
    assert full is not None and got is not None
    assert full.period_seconds == pytest.approx(CHECKPOINT_EVERY, rel=0.02)
    assert got.period_seconds == pytest.approx(full.period_seconds, rel=0.05)
    assert got.amplitude_watts == pytest.approx(full.amplitude_watts, rel=0.15)


def test_the_live_swing_leaves_out_a_window_with_a_hole_it_cannot_bridge() -> None:
    t = np.arange(0, 30, 0.05)
    watts = np.where((t % 2.0) < 1.0, 650.0, 200.0) * np.ones((8, 1))
    monitor = PowerMonitor(PowerSettings())
    times = np.broadcast_to(t, watts.shape)
    assert monitor.update(times, watts, None, 30.0, band=(0.0, 10.0)).window_swing is not None
    short, long = watts.copy(), watts.copy()
    short[:, (t > 10) & (t < 12)] = np.nan  # 2 s: bridged (a tenth of the 30 s window)
    long[:, (t > 10) & (t < 18)] = np.nan  # 8 s: not
    assert PowerMonitor(PowerSettings()).update(times, short, None, 30.0,
                                                band=(0.0, 10.0)).window_swing is not None
    assert PowerMonitor(PowerSettings()).update(times, long, None, 30.0,
                                                band=(0.0, 10.0)).window_swing is None


# --------------------------------------------------------------------------- the rule


def test_each_analysis_bridges_a_share_of_its_own_time_scale() -> None:
    from exporter.sampling.settings import StragglerSettings

    b = bridges_for(PowerSettings(), StragglerSettings())
    limits = {name: x.limit_seconds for name, x in b.items()}
    assert limits == {"step": 3.0, "segments": 12.0, "cycle": 37.5, "ramps": 5.0,
                      "dips": 5.0, "outliers": 6.0, "stalls": 6.0}
    step = b["step"]
    assert step.window_ok([(10.0, 12.0)], 0.0, 30.0)
    assert not step.window_ok([(10.0, 14.0)], 0.0, 30.0)  # longer than 3 s
    assert step.window_ok([(-5.0, 1.0)], 0.0, 30.0) is False  # a 6 s hole reaching in
    many = [(float(a), a + 2.5) for a in range(0, 30, 3)]  # each bridged, 83 % in all
    assert not step.window_ok(many, 0.0, 30.0)
    # the goodput account holds through a hole up to its own limit, and says so in the JSON
    assert bridge("goodput", 5.0).limit_seconds == 5.0 and bridge("goodput", 5.0).how == "hold"
    with pytest.raises(KeyError):
        bridge("no such analysis", 60.0)


def test_fill_bridges_a_grids_holes_or_says_it_cannot() -> None:
    b = Bridge("x", 10.0, 0.2, "interpolate")  # up to 2 s
    t = np.arange(0, 20, 0.5)
    x = np.vstack([t * 1.0, np.full(t.size, np.nan), t * 2.0])
    x[0, 10:13] = np.nan  # 1.5 s of missing grid points: a 2 s hole, bridged
    x[2, :4] = np.nan  # not sampled yet: held, no hole
    out = fill(t, x, b)
    assert out is not None
    assert np.allclose(out[0], t) and np.isnan(out[1]).all() and np.allclose(out[2, 4:], t[4:] * 2)
    assert (out[2, :4] == 4.0).all()
    assert holes_of(t, np.isfinite(x[0])) == [(4.5, 6.5)]
    x[0, 10:20] = np.nan  # 5.5 s: not bridged
    assert fill(t, x, b) is None


# --------------------------------------------------------------------------- live stragglers


def _monitor_inputs(long_power: np.ndarray, short_power: np.ndarray):
    """power_window and sweep_window for a StragglerMonitor: the long window (the level
    and the straggler window) at 0.1 s, the 2 s stall window, full utilization."""
    gpus = long_power.shape[0]
    t_long = np.arange(long_power.shape[1]) * 0.1
    t_short = t_long[-short_power.shape[1]:]
    sweep_t = np.broadcast_to(np.arange(t_long[-1] - 59, t_long[-1] + 0.5, 1.0),
                              (gpus, 60)).copy()

    def power_window(seconds: float):
        return (t_short, short_power) if seconds <= 2.0 else (t_long, long_power)

    def sweep_window(fields):
        return sweep_t, {f: np.ones_like(sweep_t) if "utilization" in f or "clock" not in f
                         else np.zeros_like(sweep_t) for f in fields}
    return power_window, sweep_window


def test_live_stall_check_compares_gpus_only_where_all_have_power() -> None:
    """GPUs 0 and 1 stop at a high reading; the others go on into a pause at full
    utilization. Read over their own samples, 0 and 1 still compute while the others
    wait: a stall made up by the hole. Compared where all have power, none."""
    from exporter.sampling.live_stragglers import StragglerMonitor
    from exporter.sampling.settings import StragglerSettings

    long_power = np.full((8, 1200), 650.0)
    short = np.full((8, 20), 200.0)
    short[:, :2] = 650.0  # the pause begins 0.2 s into the 2 s window ...
    short[:2, 2:] = np.nan  # ... and GPUs 0 and 1 have no sample of it
    power_window, sweep_window = _monitor_inputs(long_power, short)
    monitor = StragglerMonitor(StragglerSettings())
    got = monitor.update(1000.0, power_window, sweep_window, None)
    assert got.stall is not None and not got.stall.stalled
    # measured on every GPU, the same pause is no stall either (no culprit), and a real
    # culprit still makes one
    short[:2, 2:] = 650.0
    assert monitor.update(1001.0, power_window, sweep_window, None).stall.stalled
    short[:2, 2:] = 200.0
    assert not monitor.update(1002.0, power_window, sweep_window, None).stall.stalled


def test_live_straggler_window_bridges_short_holes_and_holds_on_long_ones() -> None:
    from exporter.sampling.live_stragglers import StragglerMonitor
    from exporter.sampling.settings import StragglerSettings

    t = np.arange(1200) * 0.1
    power = 400.0 + 50.0 * np.sin(t)[None, :] * np.ones((8, 1))
    holed = power.copy()
    holed[:, (t % 5.0) > 3.0] = np.nan  # 2 s in every 5 on all GPUs: bridged
    monitor = StragglerMonitor(StragglerSettings())
    got = monitor.update(1000.0, *_monitor_inputs(holed, holed[:, -20:]), None)
    assert not got.held and got.features is not None
    assert got.coverage["power"] < 0.7  # said, not held
    long = power.copy()
    long[3, -200:-100] = np.nan  # 10 s on one GPU: longer than the 6 s bridged
    got = StragglerMonitor(StragglerSettings()).update(
        1000.0, *_monitor_inputs(long, long[:, -20:]), None)
    assert got.held and got.features is None


# --------------------------------------------------------------------------- holes on some GPUs


def write_paused_log(path: Path) -> Path:
    """8 GPUs polled every 0.3 s with utilization: 8 s of compute at 650 W, then all
    pause together for 2 s at 200 W, still at full utilization (a collective): no GPU
    waits for another, so no stall."""
    t = np.arange(0, 300, 0.3)
    paused = (t % 10.0) >= 8.0
    lines = ["timestamp, index, utilization.gpu [%], power.draw [W]"]
    for r, p in zip(t.tolist(), paused.tolist(), strict=True):
        stamp = _stamp(T0 + r)
        lines += [f"{stamp}, {g}, 100 %, {200.0 if p else 650.0:.2f} W" for g in range(8)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_hole_on_some_gpus_over_a_pause_makes_no_stall(tmp_path: Path) -> None:
    """GPUs 0 and 1 lose 2.4 s over each pause (9 polls: short for every analysis
    but the step window). Drawn as a line, they compute through the pause while their
    peers sit at 200 W at full utilization: a stall with culprits 0 and 1, made up."""
    full = report(write_paused_log(tmp_path / "paused.csv"))
    assert full["stalls"] == []
    pauses = [(a - 0.2, a + 2.2) for a in np.arange(8.0, 300, 10.0).tolist()]
    holed = report(punch(tmp_path / "paused.csv", tmp_path / "holed.csv",
                         per_gpu={0: pauses, 1: pauses}))
    assert holed["gaps"]["count"] >= 25
    assert all(h["gpus"] == [0, 1] for h in holed["gaps"]["holes"])
    assert holed["stalls"] == [] and holed["outliers"] == []
    assert len(holed["dips"]) <= len(full["dips"])
