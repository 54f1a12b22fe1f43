"""The offline `analyze` subcommand on synthetic and real traces."""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from exporter.commands import analyze
from exporter.traces.trace import TraceWriter
from tests.tools import REAL_TRACE

REAL = REAL_TRACE
ROOT = Path(__file__).resolve().parents[1]
T0 = 1_758_000_000.0


def parse(*argv: str) -> argparse.Namespace:
    return analyze.build_parser().parse_args(list(argv))


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert analyze.main(parse(*argv, "--format", "json")) == 0
    out = capsys.readouterr().out
    return json.loads(out)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 GPUs at 20 Hz: idle, then in-phase 0.5 Hz step swings from 30 s to 150 s, idle."""
    p = tmp_path_factory.mktemp("trace") / "swing.cte"
    rng = np.random.default_rng(0)
    t = T0 + np.arange(0, 200, 0.05)
    busy = (t >= T0 + 30) & (t < T0 + 150)
    high = ((t - T0) * 0.5) % 1.0 < 0.5
    with TraceWriter(p, range(8), {g: 700.0 for g in range(8)}, ["power_watts"]) as w:
        for g in range(8):
            p_g = np.where(busy, np.where(high, 650.0, 200.0), 90.0) + rng.normal(0, 8, t.size)
            for ti, pi in zip(t, p_g, strict=True):
                w.write(float(ti), g, {"power_watts": float(pi)})
    return p


def test_synthetic_json(synthetic: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rep = run_json(capsys, str(synthetic))
    assert rep["gpus"] == list(range(8))
    assert rep["duration_seconds"] == pytest.approx(200, abs=0.1)
    assert rep["sample_interval_seconds"] == pytest.approx(0.05)
    assert rep["observable_band_hz"] == [0.0, pytest.approx(10.0)]
    steps = [s for s in rep["power_swings"] if s["scale"] == "step"]
    assert len(steps) == 1
    s = steps[0]
    assert s["frequency_hz"] == pytest.approx(0.5, rel=0.05)
    assert s["period_seconds"] == pytest.approx(2.0, rel=0.05)
    assert s["node_amplitude_watts"] == pytest.approx(8 * 450, rel=0.1)
    assert s["amplitude_ratio"] == pytest.approx(8 * 450 / 5600, rel=0.1)
    assert s["synchrony"] > 0.9
    assert s["max_ramp_watts_per_second"] > 8 * 450
    assert s["start"] == pytest.approx(30, abs=1.5) and s["end"] == pytest.approx(150, abs=1.5)
    dirs = [(r["direction"], round(r["time"])) for r in rep["ramps"]]
    assert [d for d, _ in dirs] == ["rise", "fall"]
    assert abs(dirs[0][1] - 30) <= 2 and abs(dirs[1][1] - 150) <= 2
    assert rep["ramps"][0]["delta_watts"] > 0 > rep["ramps"][1]["delta_watts"]
    assert "outliers" in rep and "stalls" in rep


def test_synthetic_text(synthetic: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert analyze.main(parse(str(synthetic))) == 0
    out = capsys.readouterr().out
    assert "[step]" in out and "period 2.00 s" in out
    assert "rise" in out and "fall" in out


def test_cycle_scale_in_nvidia_smi_log_without_index(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Checkpoint-like drops every 60 s for 20 s, logged at 1 Hz with no index column."""
    lines = ["timestamp, power.draw [W]"]
    for i in range(900):
        ts = f"2025/09/24 03:{17 + (4 + i) // 60:02d}:{(4 + i) % 60:02d}.000"
        watts = 250.0 if i % 60 < 20 else 650.0
        lines += [f"{ts}, {watts + g:.2f} W" for g in range(4)]
    p = tmp_path / "ckpt.csv"
    p.write_text("\n".join(lines) + "\n")
    rep = run_json(capsys, str(p), "--gpus", "4", "--tdp", "700")
    assert rep["gpus"] == [0, 1, 2, 3]
    assert rep["observable_band_hz"][1] == pytest.approx(0.5)
    cycles = [s for s in rep["power_swings"] if s["scale"] == "cycle"]
    assert len(cycles) == 1
    assert cycles[0]["period_seconds"] == pytest.approx(60, rel=0.03)
    assert cycles[0]["node_amplitude_watts"] == pytest.approx(4 * 400, rel=0.1)
    assert not [s for s in rep["power_swings"] if s["scale"] == "step"]
    # no GPU name: the data decide; the drops jump from one reading to the next, as
    # no 1 s average can (and at 1 Hz the band is 0.5 Hz either way)
    pa = rep["power_averaging"]
    assert (pa["kind"], pa["decided_by"]) == ("instantaneous", "data")
    assert any("alias" in n for n in rep["notes"])


@pytest.mark.skipif(not REAL.exists(), reason="real trace not available")
def test_real_trace(capsys: pytest.CaptureFixture[str]) -> None:
    rep = run_json(capsys, str(REAL))
    assert rep["gpus"] == list(range(8))
    assert isinstance(rep["duration_seconds"], float)
    assert rep["duration_seconds"] == pytest.approx(1347, abs=5)
    assert rep["sample_interval_seconds"] == pytest.approx(0.3, abs=0.02)
    assert rep["observable_band_hz"] == [0.0, 0.5]  # power.draw is a 1 s average
    for s in rep["power_swings"]:
        assert s["scale"] in ("step", "cycle")
        for key in ("frequency_hz", "period_seconds", "node_amplitude_watts", "synchrony",
                    "max_ramp_watts_per_second", "start", "end"):
            assert isinstance(s[key], float)
        assert s["amplitude_ratio"] is None  # the trace has no power limit
    # all eight GPUs dip together about every 22 s
    cycles = [s for s in rep["power_swings"] if s["scale"] == "cycle"]
    assert cycles and cycles[0]["period_seconds"] == pytest.approx(22.4, abs=0.5)
    assert cycles[0]["synchrony"] > 0.8
    # into and out of the phase pinned near the 700 W cap
    ramps = [r for r in rep["ramps"] if r["dip"] is None]
    assert [r["direction"] for r in ramps][:1] == ["rise"]
    assert ramps[0]["time"] == pytest.approx(162, abs=5)
    assert all(isinstance(r["delta_watts"], float) for r in ramps)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("", "empty file"),
        ("timestamp, index, temperature.gpu\n2025/09/24 03:17:04.490, 0, 40\n", "no power"),
        ("timestamp, power.draw [W]\n2025/09/24 03:17:04.490, 40 W\n", "--gpus N"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         content: str, needle: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(content)
    assert analyze.main(parse(str(p))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"cluster-telemetry-exporter: analyze: {p}:")
    assert needle in err


def test_module_entry_point_no_traceback(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "exporter.commands.analyze",
                        str(tmp_path / "missing.csv")],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("cluster-telemetry-exporter: analyze: ")
    assert "cannot read" in r.stderr


# --------------------------------------------------------------------------- stragglers and stalls


@pytest.fixture(scope="module")
def straggler_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 GPUs at 2 Hz for 12 minutes, steps of 2 s (1.4 s compute at 650 W, wait
    at 200 W); GPU 2 runs 15 degC hotter throughout; every 120 s rank 0 stops
    for 15 s (0 % util, 100 W) while the others busy-wait (100 %, ~150 W)."""
    p = tmp_path_factory.mktemp("trace") / "strag.cte"
    rng = np.random.default_rng(3)
    rel = np.arange(0, 720, 0.5)
    fields = ["power_watts", "utilization_gpu_ratio", "temperature_celsius", "sm_clock_hertz",
              "clock_event_reasons"]
    ckpt = (rel % 120) >= 105
    comp = (rel % 2.0) < 1.4
    with TraceWriter(p, range(8), {g: 700.0 for g in range(8)}, fields) as w:
        for g in range(8):
            pw = np.where(comp, 650.0, 200.0) + rng.normal(0, 10, rel.size)
            util = np.ones(rel.size)
            if g == 0:
                pw[ckpt], util[ckpt] = 100.0, 0.0
            else:
                pw[ckpt] = 150.0 + rng.normal(0, 5, ckpt.sum())
            temp = 62 + rng.uniform(-3, 3) + (15 if g == 2 else 0) + rng.normal(0, 0.5, rel.size)
            clk = 1.98e9 + rng.normal(0, 15e6, rel.size)
            for i in range(rel.size):
                w.write(T0 + float(rel[i]), g, {
                    "power_watts": float(pw[i]), "utilization_gpu_ratio": float(util[i]),
                    "temperature_celsius": float(temp[i]), "sm_clock_hertz": float(clk[i]),
                    "clock_event_reasons": 0.0})
    return p


def test_outliers_and_stalls(straggler_trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rep = run_json(capsys, str(straggler_trace))
    assert rep["peer_statistics"] is True
    assert rep["straggler_windows_analysed"] == 67  # 60 s windows every 10 s over 720 s
    assert [(o["gpu"], o["signal"], o["direction"]) for o in rep["outliers"]] == [
        (2, "temperature", "high")]
    o = rep["outliers"][0]
    assert o["score"] > 3.5
    assert o["start"] == pytest.approx(0, abs=0.01)
    assert o["end"] == pytest.approx(rep["duration_seconds"], abs=0.01)
    stalls = rep["stalls"]
    assert len(stalls) == 6
    for k, s in enumerate(stalls):
        assert s["culprit_gpus"] == [0] and s["waiting_gpus"] == list(range(1, 8))
        assert s["start"] == pytest.approx(120 * k + 105, abs=1.0)
        assert s["end"] == pytest.approx(120 * k + 120, abs=1.0)
    assert rep["peer_scores"]["2"]["temperature"] > 3.5
    assert rep["peer_scores"]["5"]["temperature"] < 3.5
    assert not any("not in the trace" in n for n in rep["notes"])


def test_outliers_text_and_persistence_flag(straggler_trace: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert analyze.main(parse(str(straggler_trace))) == 0
    out = capsys.readouterr().out
    assert "outliers (held >= 300 s): 1" in out
    assert "GPU 2 temperature high" in out
    assert "stalls: 6" in out and "culprit GPU(s) 0; waiting 1, 2, 3, 4, 5, 6, 7" in out
    rep = run_json(capsys, str(straggler_trace), "--persistence", "800")
    assert rep["outliers"] == [] and len(rep["stalls"]) == 6
    assert rep["persistence_seconds"] == 800


def test_tiny_trace_says_no_peer_statistics(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["timestamp, index, utilization.gpu [%], temperature.gpu, power.draw [W]"]
    for i in range(400):
        ts = f"2025/09/24 03:{17 + (4 + i) // 60:02d}:{(4 + i) % 60:02d}.000"
        lines += [f"{ts}, 0, 100 %, 40, 650.00 W", f"{ts}, 1, 0 %, 90, 80.00 W"]
    p = tmp_path / "two.csv"
    p.write_text("\n".join(lines) + "\n")
    rep = run_json(capsys, str(p), "--persistence", "0")
    assert rep["peer_statistics"] is False
    assert rep["outliers"] == [] and rep["stalls"] == []
    assert any("no peer statistics" in n and "at least 3" in n for n in rep["notes"])
    assert any("sm_clock_hertz" in n for n in rep["notes"])


@pytest.mark.skipif(not REAL.exists(), reason="real trace not available")
def test_real_trace_stragglers_and_stall(capsys: pytest.CaptureFixture[str]) -> None:
    rep = run_json(capsys, str(REAL))
    # rank 0 keeps computing near 690 W at ~91 % while GPUs 1-7 sit at 100 % and ~160 W
    assert rep["stalls"] == [{"start": pytest.approx(466.5, abs=1.0),
                              "end": pytest.approx(470, abs=1.0),
                              "waiting_gpus": [1, 2, 3, 4, 5, 6, 7], "culprit_gpus": [0],
                              # rank 0 still computes: no checkpoint writer, a stall
                              "cause": "stall"}]
    # GPU 1 is the hottest throughout, but during training its peers spread over
    # ~11 degC and it scores |M| ~ 2.3: no finding at the default 5 minutes
    assert rep["outliers"] == []
    assert 1.5 < rep["peer_scores"]["1"]["temperature"] < 3.5
    # when the whole node idles at the end (the last ~2.5 min) it stands out
    # clearly, for about 110 s of window ends
    rep = run_json(capsys, str(REAL), "--persistence", "60")
    assert [(o["gpu"], o["signal"], o["direction"]) for o in rep["outliers"]] == [
        (1, "temperature", "high")]
    assert rep["outliers"][0]["start"] > 1150 and rep["outliers"][0]["score"] > 10


# --------------------------------------------------------------------------- bad and short input


def test_absurd_values_are_dropped_and_counted(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """GPU 1000000000, NaN, inf and 1e300 W: skipped or dropped, each with its reason."""
    p = tmp_path / "absurd.cte"
    with TraceWriter(p, range(2), {0: 700.0, 1: 700.0}, ["power_watts"]) as w:
        for i in range(1200):
            for g in (0, 1):
                w.write(T0 + i * 0.05, g, {"power_watts": 400.0 + 50 * ((i // 20) % 2)
                                           + float(np.random.default_rng(i).normal(0, 3))})
    with open(p, "a") as fh:
        fh.write(f"{T0 + 1.0},1000000000,400.0\n"
                 f"{T0 + 2.025},0,nan\n{T0 + 2.075},0,inf\n{T0 + 2.125},1,1e300\n"
                 f"{T0 + 2.175},1,-5\n")
    rep = run_json(capsys, str(p))
    assert rep["gpus"] == [0, 1]
    assert rep["skipped_lines"] == 1
    assert rep["rejected_values"] == {"power_watts not a number": 1,
                                      "power_watts infinite": 1,
                                      "power_watts above 5000 W": 1,
                                      "power_watts below 0 W": 1}
    notes = " ".join(rep["notes"])
    assert "GPU index 1000000000 out of range (0-4095) (1)" in notes
    assert "4 implausible value(s) dropped" in notes
    assert rep["node_mean_watts"] < 2 * 450 + 1  # nothing absurd got into the analysis


def test_skipped_lines_are_counted_with_their_real_counts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The notes quote each kind of skipped line as it was: cell counts, not placeholders."""
    p = tmp_path / "cells.cte"
    with TraceWriter(p, range(2), None, ["power_watts", "temperature_celsius"]) as w:
        for i in range(1200):
            for g in (0, 1):
                w.write(T0 + i * 0.05, g, {"power_watts": 400.0})
    with open(p, "a") as fh:
        fh.writelines(f"{T0 + 60 + i},0,400.0\n" for i in range(3))  # 3 cells of 4
        fh.write(f"{T0 + 64},0,400.0,50,7,8\n")  # 6 cells
        fh.write(f"{T0 + 65},0,4x0.0,50\n")
    rep = run_json(capsys, str(p))
    assert rep["skipped_lines"] == 5
    note = next(n for n in rep["notes"] if "line(s) skipped" in n)
    assert note == ("5 line(s) skipped, first at line 2403: 3 cells, column line has 4 "
                    "(3; 1 more like it), unparsable number (1)"), note


def test_absurd_values_in_nvidia_smi_logs(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["timestamp, index, power.draw [W], temperature.gpu"]
    for i in range(300):
        ts = f"2025/09/24 03:{17 + (4 + i) // 60:02d}:{(4 + i) % 60:02d}.000"
        lines += [f"{ts}, 0, 300.00 W, 50", f"{ts}, 1, 310.00 W, 51"]
    lines += ["2025/09/24 03:22:05.000, 1000000000, 300.00 W, 50",
              "2025/09/24 03:22:06.000, 0, 1e300 W, 50",
              "2025/09/24 03:22:07.000, 1, 300.00 W, 1e300",
              "2025/09/24 03:22:08.000, 0, nan W, 50"]
    p = tmp_path / "absurd.csv"
    p.write_text("\n".join(lines) + "\n")
    rep = run_json(capsys, str(p), "--gpus", "2")
    assert rep["gpus"] == [0, 1]
    assert rep["skipped_lines"] == 2  # the index, and "nan W" (not a number nvidia-smi prints)
    assert rep["rejected_values"] == {"power_watts above 5000 W": 1,
                                      "temperature_celsius above 200 degC": 1}


def test_stray_timestamp_does_not_stretch_the_trace(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "stray.cte"
    with TraceWriter(p, [0], None, ["power_watts"]) as w:
        for i in range(1200):
            w.write(T0 + i * 0.05, 0, {"power_watts": 400.0})
        w.write(5.0, 0, {"power_watts": 400.0})  # 1970
    rep = run_json(capsys, str(p))
    assert rep["duration_seconds"] == pytest.approx(60, abs=0.1)
    assert any("timestamp far from the rest" in n for n in rep["notes"])


def test_too_short_for_a_detector_says_so(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "short.cte"
    with TraceWriter(p, range(4), None, ["power_watts"]) as w:
        for i in range(240):  # 12 s at 20 Hz
            for g in range(4):
                w.write(T0 + i * 0.05, g, {"power_watts": 200.0 + 400 * ((i // 20) % 2)})
    rep = run_json(capsys, str(p))
    assert set(rep["not_run"]) == {"step", "cycle", "ramps", "outliers", "stalls"}
    assert "shorter than the 30 s step window" in rep["not_run"]["step"]
    assert "no utilization" in rep["not_run"]["stalls"]
    assert rep["power_swings"] == [] and rep["step_windows_analysed"] == 0
    assert analyze.main(parse(str(p))) == 0
    out = capsys.readouterr().out
    # where a detector did not run, its line says so and why, never "none found"
    lines = {ln.split(":", 1)[0]: ln for ln in out.splitlines() if ":" in ln}
    assert ("power swings: not run: step: the trace (11.9 s) is shorter than the 30 s step "
            "window") in out
    assert "cycle: the trace (11.9 s) is shorter than the 40 s" in lines["power swings"]
    assert lines["ramps"].startswith("ramps: not run: the trace (11.9 s) is shorter than the 55 s")
    assert lines["outliers (held >= 300 s)"].endswith(
        "not run: the trace (11.9 s) is shorter than the 60 s straggler window (--outlier-window)")
    assert lines["stalls"].startswith("stalls: not run: the trace has no utilization")
    assert "none found" not in out.replace("dips (pauses): none found", "")
    assert "not run," not in out  # said once, where it belongs, not again in the notes
    # sparse samples: the window exists but holds too few of them
    q = tmp_path / "sparse.cte"
    with TraceWriter(q, range(4), None, ["power_watts"]) as w:
        for i in range(120):  # 10 min, one sample every 5 s
            for g in range(4):
                w.write(T0 + i * 5.0, g, {"power_watts": 400.0})
    rep = run_json(capsys, str(q))
    assert "holds 6 samples" in rep["not_run"]["step"]


def test_grid_too_large_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "big.cte"
    with TraceWriter(p, [0], None, ["power_watts"]) as w:
        for i in range(200):
            w.write(T0 + i * 0.05, 0, {"power_watts": 400.0})
    monkeypatch.setattr(analyze, "MAX_GRID_CELLS", 100)
    assert analyze.main(parse(str(p))) == 2
    assert "more than the 100 analyze handles" in capsys.readouterr().err


# --------------------------------------------------------------------------- report text


def test_text_report_says_how_it_decided_unresolved_and_dips(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.synth_power import H100, MATRIX, write_trace

    p = write_trace(MATRIX["h100-3hz-irregular-square-0.625"].case, tmp_path)
    assert analyze.main(parse(str(p))) == 0
    out = capsys.readouterr().out
    assert "power      averaged (1 s), decided by gpu-name (high confidence)" in out
    assert f"GPU name '{H100}': Hopper averages power.draw over ~1 s" in out
    assert "s: swing above 0.45 Hz, unresolved" in out and "apparent 0.62" in out
    p = write_trace(MATRIX["a100-20hz-square-0.625-pauses"].case, tmp_path)
    assert analyze.main(parse(str(p), "--tdp", "700")) == 0
    out = capsys.readouterr().out
    assert "period 1.60 s (0.624 Hz)" in out
    assert "dips (pauses): 2" in out and "(dip 2)" in out
    assert "-61 %), fall in 0.05 s, rise in 0.05 s" in out


@pytest.mark.skipif(not REAL.exists(), reason="real trace not available")
def test_real_trace_band_and_dips(capsys: pytest.CaptureFixture[str]) -> None:
    rep = run_json(capsys, str(REAL))
    pa = rep["power_averaging"]
    # no GPU name: the data decide (edges take ~1 s, the noise fades above 1 Hz)
    assert (pa["kind"], pa["seconds"], pa["decided_by"]) == ("averaged", 1.0, "data")
    assert pa["data"]["noise_floor_ratio"] < 0.05
    # the return from the 700 W phase at 466-494 s is a dip, linked to the stall at 466.6 s
    dip = next(d for d in rep["dips"] if 460 < d["start"] < 470)
    assert dip["duration_seconds"] == pytest.approx(27.6, abs=1.5)
    assert dip["depth_ratio"] == pytest.approx(0.43, abs=0.05)
    assert [rep["stalls"][i]["culprit_gpus"] for i in dip["stalls"]] == [[0]]
    i = rep["dips"].index(dip)
    assert [r["direction"] for r in rep["ramps"] if r["dip"] == i] == ["fall", "rise"]
    # and rank 0 holding ~690 W while its peers drop to ~150 W for 6 s at 43 s
    assert any(40 < d["start"] < 46 and d["depth_ratio"] > 0.3 for d in rep["dips"])
    assert rep["power_swings"][0]["scale"] == "cycle"  # no step swing: none invented


# --------------------------------------------------------------------------- live agreement


def test_live_monitor_agrees_with_analyze(tmp_path: Path) -> None:
    """The same recorded samples through PowerMonitor and through analyze: one answer."""
    from exporter.sampling.live_power import PowerMonitor
    from exporter.sampling.settings import PowerSettings
    from exporter.traces.load import load_trace

    rng = np.random.default_rng(5)
    t = T0 + np.arange(0, 120, 0.05) + rng.uniform(-0.002, 0.002, 2400)
    watts = np.stack([np.where(((t - T0 + 0.01 * g) * 0.8) % 1.0 < 0.4, 640.0, 180.0)
                      + rng.normal(0, 8, t.size) for g in range(4)])
    p = tmp_path / "live.cte"
    with TraceWriter(p, range(4), {g: 700.0 for g in range(4)}, ["power_watts"],
                     power_averaging_seconds=None) as w:
        for i in range(t.size):
            for g in range(4):
                w.write(float(t[i]), g, {"power_watts": float(watts[g, i])})
    trace = load_trace(p)
    settings = PowerSettings(window_seconds=30.0, update_seconds=5.0)
    monitor = PowerMonitor(settings)
    end = float(t[-1])
    times = np.tile(np.asarray([round(x, 6) for x in t]), (4, 1))
    live = monitor.update(times, watts, np.full(4, 700.0), end, band=(0.0, 10.0)).window_swing
    offline = analyze.swing_at(trace, end, 30.0, phase_grid_seconds=5.0)
    assert live is not None
    assert offline.observable_band_hz == pytest.approx(live.observable_band_hz, rel=0.01)
    assert offline.node.frequency_hz == pytest.approx(live.node.frequency_hz, rel=0.01)
    assert offline.node.frequency_hz == pytest.approx(0.8, rel=0.02)
    assert offline.node.amplitude_watts == pytest.approx(live.node.amplitude_watts, rel=0.02)
    assert offline.synchrony == pytest.approx(live.synchrony, abs=0.02)
    assert offline.candidate == live.candidate is True
    assert offline.phase_reference_time == live.phase_reference_time
    # and the whole-trace report names the same swing
    rep = analyze.analyse_trace(trace, parse(str(p)))
    steps = [s for s in rep["power_swings"] if s["scale"] == "step"]
    assert len(steps) == 1 and steps[0]["frequency_hz"] == pytest.approx(
        live.node.frequency_hz, rel=0.02)


def test_detectors_that_ran_and_found_nothing_say_none_found(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The other side of "not run": long enough, with utilization, nothing to find."""
    p = tmp_path / "flat.cte"
    with TraceWriter(p, range(4), None, ["power_watts", "utilization_gpu_ratio"]) as w:
        for i in range(1800):  # 90 s at 20 Hz, every GPU flat and busy
            for g in range(4):
                w.write(T0 + i * 0.05, g, {"power_watts": 400.0 + (i * 7 + g) % 3,
                                           "utilization_gpu_ratio": 1.0})
    rep = run_json(capsys, str(p), "--persistence", "30", "--tdp", "700")
    assert rep["not_run"] == {}
    assert rep["power_swings"] == [] and rep["outliers"] == [] and rep["stalls"] == []
    assert analyze.main(parse(str(p), "--persistence", "30", "--tdp", "700")) == 0
    out = capsys.readouterr().out
    for line in ("power swings: none found", "ramps: none found", "dips (pauses): none found",
                 "outliers (held >= 30 s): none found", "stalls: none found"):
        assert line in out.splitlines(), line
    assert "not run" not in out
    # one scale not run, the other ran: both said on the one line
    assert analyze.main(parse(str(p), "--persistence", "30", "--tdp", "700",
                              "--window", "200")) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines()
                if ln.startswith("power swings:"))
    assert line.startswith("power swings: none found; step not run: the trace ("), line
    assert "shorter than the 200 s step window" in line


# --------------------------------------------------------------------------- gaps in a trace

# `record --fake --duration 60` (the training scenario; host renamed), gzip-compressed
RECORDED_60S = ROOT / "tests" / "data" / "record-fake-60s.cte.gz"


def _recorded_lines() -> list[str]:
    return gzip.decompress(RECORDED_60S.read_bytes()).decode().splitlines(keepends=True)


def _overlaps(item: dict, gap: dict) -> bool:
    return item["start"] < gap["end"] and item["end"] > gap["start"]


def test_a_gap_cut_from_a_recording_is_found_reported_and_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """3,000 lines deleted from the middle of a 60 s recording: one gap of all GPUs,
    in the notes and the JSON, and nothing concluded from the interpolated stretch."""
    lines = _recorded_lines()
    whole, cut = tmp_path / "whole.cte", tmp_path / "cut.cte"
    whole.write_text("".join(lines))
    mid = len(lines) // 2
    cut.write_text("".join(lines[:mid - 1500] + lines[mid + 1500:]))
    full = run_json(capsys, str(whole))
    assert full["gaps"]["count"] == 0 and not any("gap" in n for n in full["notes"])
    swing = next(s for s in full["power_swings"] if s["scale"] == "step")
    assert swing["duty_cycle"] == pytest.approx(0.65, abs=0.03) and swing["synchrony"] > 0.98

    rep = run_json(capsys, str(cut))
    assert rep["gaps"]["count"] == 1
    gap = rep["gaps"]["holes"][0]
    assert rep["gaps"]["total_seconds"] == pytest.approx(gap["duration_seconds"])
    assert gap["gpus"] == list(range(8))
    assert 7 < gap["duration_seconds"] < 10  # ~3,000 rows / (8 GPUs x 50 samples/s)
    assert 20 < gap["start"] < gap["end"] < 40
    note = next(n for n in rep["notes"] if "gap(s)" in n)
    assert note.startswith("1 gap(s) in the power samples (longer than 6x a GPU's typical "
                           f"interval), {gap['duration_seconds']:.1f} s in all: "
                           f"{gap['start']:.1f}-{gap['end']:.1f} s")
    # longer than the step window's tenth, the 5 s either side of a ramp, the straggler
    # window's tenth and the stall context's twentieth: only the 120 s segment window and
    # the cycle (a quarter of its longest period) bridge it
    assert "all GPUs" in note and ("bridged: segments 1 (up to 12 s, interpolate), cycle 1 "
                                   "(up to 37.5 s, fold)") in note
    assert ("windows across the longer ones left out of step (1), ramps (1), dips (1), "
            "outliers (1), stalls (1)") in note
    assert rep["gaps"]["analyses"]["step"] == {"bridges_up_to_seconds": 3.0,
                                               "how": "interpolate", "bridged": 0,
                                               "left_out": 1}
    # no window holds 30 s without the gap: the step detector says so, it finds no swing
    # with the duty and synchrony the interpolation made up
    assert "gap" in rep["not_run"]["step"]
    bridged = [s for s in rep["power_swings"] if s.get("method") == "segments"]
    for found in (*rep["power_swings"], *rep["dips"], *rep["stalls"], *rep["outliers"]):
        assert found in bridged or not _overlaps(found, gap), found
    for found in bridged:  # read through the gap, and as found without it
        assert found["duty"] == pytest.approx(0.65, abs=0.05) and found["synchrony"] > 0.98
    assert rep["stalls"] == []
    assert analyze.main(parse(str(cut))) == 0
    text = capsys.readouterr().out
    assert "notes:" in text and note in text


def _gap_at_different_places(path: Path) -> Path:
    """8 GPUs in a synchronous 0.5 Hz swing at 50 Hz (utilization at 1 Hz): GPUs 0 and 1
    lose 29-37 s, between two high readings; GPUs 2-7 lose 29.6-37.6 s, between two low
    ones. Interpolated, 0 and 1 look busy at 650 W while the others sit at 200 W with
    full utilization: a stall's signature, made up."""
    rng = np.random.default_rng(5)
    rel = np.round(np.arange(0, 90, 0.02), 2)
    comp = (rel % 2.0) < 1.4
    with TraceWriter(path, range(8), {g: 700.0 for g in range(8)},
                     ["power_watts", "utilization_gpu_ratio"]) as w:
        for g in range(8):
            lo, hi = (29.0, 37.0) if g < 2 else (29.6, 37.6)
            pw = np.where(comp, 650.0, 200.0) + rng.normal(0, 5, rel.size)
            for r, p in zip(rel.tolist(), pw.tolist(), strict=True):
                if lo < r < hi:
                    continue
                values = {"power_watts": p}
                if r == round(r):
                    values["utilization_gpu_ratio"] = 1.0
                w.write(T0 + r, g, values)
    return path


def test_a_gap_makes_no_stall_and_no_dip(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    rep = run_json(capsys, str(_gap_at_different_places(tmp_path / "gap.cte")))
    assert rep["gaps"]["holes"] == [{"start": pytest.approx(29.0), "end": pytest.approx(37.6),
                                     "duration_seconds": pytest.approx(8.6),
                                     "gpus": list(range(8))}]
    assert rep["stalls"] == [] and rep["dips"] == []  # were: a stall with culprits 0, 1
    assert all(r["time"] < 29 or r["time"] > 37.6 for r in rep["ramps"])
    steps = [s for s in rep["power_swings"] if s["scale"] == "step"]
    assert steps and all(s["start"] >= 37.6 for s in steps)
    assert steps[0]["synchrony"] > 0.98


def test_gaps_are_told_from_jitter() -> None:
    from exporter.offline.gaps import Gap, find_gaps, gpu_gaps

    t = np.cumsum(np.full(200, 0.3))
    t[100:] += 1.5 - 0.3  # one interval 5x the typical: a slow poll, no gap
    assert gpu_gaps(t) == []
    t[150:] += 2.1 - 0.3  # 7x: a gap
    assert gpu_gaps(t) == [(pytest.approx(t[149]), pytest.approx(t[150]))]
    a = np.arange(0, 100, 0.02)
    b = a[(a < 30) | (a > 38)]
    c = a[(a < 31) | (a > 39)]
    d = a[(a < 60) | (a > 61)]
    assert find_gaps({0: b, 1: c, 2: d, 3: a}) == [
        Gap(pytest.approx(29.98), pytest.approx(39.02), (0, 1)),
        Gap(pytest.approx(59.98), pytest.approx(61.02), (2,))]


def test_a_gap_in_the_sweep_alone_is_read_as_missing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The sweep hung on GPU 2 for 25 s while its power went on: its utilization is
    missing there, not a straight line from the last reading to the next."""
    p = tmp_path / "sweep.cte"
    with TraceWriter(p, range(4), None, ["power_watts", "utilization_gpu_ratio"]) as w:
        for g in range(4):
            for i in range(90 * 20):
                r = i / 20
                values = {"power_watts": 400.0 + 20 * (i % 7)}
                if i % 20 == 0 and not (g == 2 and 20 < r < 45):
                    values["utilization_gpu_ratio"] = 0.9 if r <= 20 else 0.1
                w.write(T0 + r, g, values)
    rep = run_json(capsys, str(p))
    assert rep["gaps"]["count"] == 0  # power has none
    assert ("utilization_gpu_ratio: 1 gap(s) in its readings (GPU(s) 2, 25.0 s in all), "
            "read as missing there, not interpolated") in rep["notes"]
    trace = analyze.load_trace(str(p))
    g, _ = analyze._grid(trace, None)
    util = analyze._field_grid(trace, g, "utilization_gpu_ratio")
    assert util is not None
    rel = g.t - g.t[0]
    inside = (rel > 20.5) & (rel < 44.5)
    assert np.isnan(util[2, inside]).all() and np.isfinite(util[1, inside]).all()


def test_windows_are_laid_between_gaps() -> None:
    from exporter.analysis.signal import stretch_starts

    valid = np.ones(100, dtype=bool)
    valid[40:45] = False  # a gap: stretches 0-39 and 45-99
    assert stretch_starts(valid, 20, 10, tail=False) == [0, 10, 20, None, 45, 55, 65, 75]
    assert stretch_starts(valid, 20, 10, tail=True) == [0, 10, 20, None, 45, 55, 65, 75, 80]
    assert stretch_starts(valid, 50, 10, tail=True) == [45, 50]  # the first is too short
    assert stretch_starts(np.zeros(10, dtype=bool), 2, 1, tail=True) == []


@pytest.mark.skipif(not REAL.exists(), reason="real trace not available")
def test_real_trace_has_no_gap(capsys: pytest.CaptureFixture[str]) -> None:
    """A poll loop around nvidia-smi every ~0.3 s, its slowest poll 1.57 s apart: jitter,
    not a gap."""
    rep = run_json(capsys, str(REAL))
    assert rep["gaps"]["count"] == 0 and not any("gap" in n for n in rep["notes"])


def test_analyze_reads_a_gzip_trace(capsys: pytest.CaptureFixture[str]) -> None:
    rep = run_json(capsys, str(RECORDED_60S))
    assert rep["format"] == "cte" and rep["gpus"] == list(range(8))
    assert rep["duration_seconds"] == pytest.approx(61.8, abs=0.5)
    assert any(s["scale"] == "step" for s in rep["power_swings"])
