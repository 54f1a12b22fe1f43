"""record writes a trace of the live sampler; run --replay serves a trace as if live."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from exporter.app import Exporter
from exporter.config import Config
from exporter.offline.trace import load_trace
from exporter.sim.replay import replay_library
from tests.tools import REAL_TRACE, wait_for

REAL = REAL_TRACE
CLI = [sys.executable, "-m", "exporter"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "node.cte"
    result = subprocess.run([*CLI, "record", "--fake", "--duration", "4", "--out", str(out)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "recorded 4 s of 8 GPUs" in result.stdout
    return out


def test_record_keeps_power_at_full_rate_and_the_sweep_at_1_hz(recorded):
    trace = load_trace(recorded)
    assert trace.format == "cte" and trace.gpus == list(range(8))
    assert trace.tdp_watts == {g: 700.0 for g in range(8)}
    s = trace.series[3]
    power = s.fields["power_watts"]
    assert np.isfinite(power).sum() >= 70  # ~20 Hz for 4 s
    assert np.median(np.diff(s.t[np.isfinite(power)])) == pytest.approx(0.05, rel=0.2)
    temps = s.fields["temperature_celsius"]
    assert 3 <= np.isfinite(temps).sum() <= 6  # once a second
    energy = s.fields["energy_joules"][np.isfinite(s.fields["energy_joules"])]
    assert (np.diff(energy) >= 0).all()
    assert np.nanmax(power) > 600 and np.nanmin(power) < 260  # the training swing
    # the header says the power is instantaneous and which GPUs these are
    assert trace.power_averaging_stated and trace.power_averaging_seconds is None
    assert len(trace.gpu_names) == 8 and all(trace.gpu_names.values())


def test_record_errors(tmp_path):
    result = subprocess.run([*CLI, "record", "--duration", "1", "--out", str(tmp_path / "x")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "add --fake" in result.stderr
    result = subprocess.run([*CLI, "record", "--fake", "--duration", "-1", "--out", "x"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "--duration" in result.stderr
    result = subprocess.run([*CLI, "record", "--fake", "--duration", "1", "--out",
                             str(tmp_path / "no" / "dir" / "x")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "cannot write" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(not REAL.exists(), reason="shared/data is not beside the checkout")
def test_replay_library_follows_the_real_trace_and_loops():
    trace = load_trace(REAL)
    clock = [1_790_000_000.0]
    lib = replay_library(trace, speed=1.0, clock=lambda: clock[0])
    gpu = lib.gpus[1]
    first = trace.series[1]
    assert gpu.ideal_power(clock[0]) == pytest.approx(first.fields["power_watts"][0])
    assert gpu.recorded("temperature_celsius", clock[0]) == 63  # the hot GPU of the trace
    duration = first.t[-1] - first.t[0]
    e1 = gpu.energy_joules(clock[0] + duration - 1)
    e2 = gpu.energy_joules(clock[0] + duration + 1)  # past the end: the trace loops
    assert e2 > e1
    assert gpu.ideal_power(clock[0] + duration + 0.0) == pytest.approx(
        first.fields["power_watts"][0], rel=0.05)
    fast = replay_library(trace, speed=10.0, clock=lambda: clock[0]).gpus[1]
    # ten times faster: the same trace power over a tenth of the time
    assert fast.energy_joules(clock[0] + 10) == pytest.approx(gpu.energy_joules(clock[0] + 100)
                                                             / 10, rel=1e-6)


def test_run_replay_serves_the_trace_through_the_real_pipeline(recorded):
    exp = Exporter(Config(listen_address="127.0.0.1:0", replay=str(recorded),
                          collector_infiniband=False, collector_host=False))
    exp.start()
    try:
        wait_for(lambda: len(exp.current.snapshot.states) == 8, timeout=10)
        snap = exp.current.snapshot
        assert snap.backend == "replay" and snap.gpu_count == 8
        watts = [s.watts for s in snap.power.values()]
        assert all(150 < w < 720 for w in watts)
        body = exp.current.body.decode()
        assert 'cte_backend_info{backend="replay"' in body
        time.sleep(1.5)
        assert exp.current.snapshot.power_loop.achieved_hertz > 15
    finally:
        exp.stop()


def test_replay_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp, index\n2025/01/01 00:00:00.000, 0\n")
    result = subprocess.run([*CLI, "run", "--replay", str(bad), "--web.listen-address",
                             "127.0.0.1:0"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "bad.csv:1:" in result.stderr
    assert "Traceback" not in result.stderr
    result = subprocess.run([*CLI, "run", "--replay", str(bad), "--fake"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "choose one" in result.stderr
