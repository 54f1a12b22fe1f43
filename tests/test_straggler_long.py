"""Thirty simulated minutes of the fake's scenarios through the offline analysis: the
healthy node yields no finding at all; the straggler node yields its GPU only.

The fake runs on a manual clock, so 30 minutes of 5 Hz power and 1 Hz sweeps are
generated in seconds (sweeps every 2 s), written as a cte trace and read back by
`analyze`.
"""

from __future__ import annotations

import pynvml
import pytest

from exporter.commands import analyze
from exporter.gpu import catalogue
from exporter.gpu.backend import NvmlBackend
from exporter.gpu.reading import read_values
from exporter.sim import fake
from exporter.sim.scenarios import load_scenario
from exporter.traces.load import load_trace
from exporter.traces.trace import TraceWriter
from tests.tools import ManualClock

MINUTES = 30


def simulate(tmp_path, scenario_name: str):
    clock = ManualClock()
    path = tmp_path / f"{scenario_name}.cte"
    fields = ["power_watts", "sm_clock_hertz", "temperature_celsius", "utilization_gpu_ratio",
              "clock_event_reasons"]
    swept = [catalogue.BY_KEY[key] for key in fields[1:]]
    with fake.installed(load_scenario(scenario_name), clock, costs=None) as lib:
        backend = NvmlBackend()
        gpus = backend.open()
        with TraceWriter(path, range(gpus), dict.fromkeys(range(gpus), 700.0),
                         fields) as writer:
            for tick in range(MINUTES * 60 * 5):  # 5 Hz is plenty for 60 s windows
                clock.advance(0.2)
                for gpu in range(gpus):
                    # power straight from the fake's physics (the NVML path is covered
                    # elsewhere; 72,000 calls through pynvml would only cost time)
                    values = {"power_watts": lib.gpus[gpu].sample_watts(
                        int(clock.now / lib.gpus[gpu].sample_interval))}
                    if tick % 10 == 0:  # the sweep every 2 s: 30 points a window
                        # through pynvml, only the values the trace keeps
                        state = read_values(backend, gpu, swept)
                        values.update({k: state.get(k) for k in fields[1:]})
                    writer.write(clock.now, gpu, values)
        backend.close()
    assert pynvml.nvmlLib is None
    return path


def report(path) -> dict:
    args = analyze.build_parser().parse_args([str(path), "--format", "json"])
    return analyze.analyse_trace(load_trace(path), args)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("long")


def test_healthy_training_yields_no_finding_over_30_minutes(tmp):
    rep = report(simulate(tmp, "training"))
    assert rep["duration_seconds"] > MINUTES * 60 - 5
    assert rep["outliers"] == []
    assert rep["stalls"] == []


def test_straggler_over_30_minutes_names_gpu_5_only(tmp):
    rep = report(simulate(tmp, "straggler"))
    assert rep["outliers"], "the throttled GPU must be found"
    assert {o["gpu"] for o in rep["outliers"]} == {5}
    assert {o["signal"] for o in rep["outliers"]} >= {"sm_clock"}
