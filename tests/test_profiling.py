"""The profiling collector (GPM) on the fake: what /metrics serves per scenario, what the
fake's GPM answers for each phase of the workload, where GPM is unsupported, and the
compute share as a straggler signal. Everything runs in simulated time."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from exporter.collectors.profiling.reading import ProfilingCollector
from exporter.commands import analyze
from exporter.gpu import gpm
from exporter.gpu.backend import NvmlBackend
from exporter.sampling.clock import ManualClock
from exporter.sampling.sampler import CollectorMaker, Sampler, SamplerSettings
from exporter.sampling.settings import StragglerSettings
from exporter.sim import fake
from exporter.sim.fake_gpm import GpmSymbols
from exporter.sim.scenarios import load_scenario
from exporter.traces.trace import TraceWriter
from tests.tools import http_get, samples, scenario_from_yaml

FIVE = ("gpu_graphics_engine_active_ratio", "gpu_sm_active_ratio", "gpu_sm_occupancy_ratio",
        "gpu_tensor_active_ratio", "gpu_dram_active_ratio")


def scrape(running_exporter, scenario: str, seconds: float = 25, **config) -> dict:
    exp = running_exporter.start(manual=True, scenario=scenario, **config)
    exp.sampler.advance(seconds)
    response, body = http_get(exp.port)
    assert response.status == 200
    return samples(body)


def by_gpu(found: dict, name: str) -> dict[str, float]:
    return {s.labels["gpu"]: s.value for s in found.get(name, [])}


# --------------------------------------------------------------- what /metrics serves

def test_training_serves_every_ratio_for_every_gpu(running_exporter):
    found = scrape(running_exporter, "training")
    for name in (*FIVE, "gpu_fp64_active_ratio", "gpu_fp32_active_ratio",
                 "gpu_fp16_active_ratio"):
        values = by_gpu(found, name)
        assert sorted(values) == [str(g) for g in range(8)], name
        assert all(0.0 <= v <= 1.0 for v in values.values()), (name, values)
    tensor = by_gpu(found, "gpu_tensor_active_ratio")
    assert 0.2 < np.mean(list(tensor.values())) < 0.98
    # a collective keeps a kernel resident: the engine is busier than the tensor pipes
    graphics = by_gpu(found, "gpu_graphics_engine_active_ratio")
    assert all(graphics[g] > tensor[g] + 0.3 for g in tensor)
    assert by_gpu(found, "gpu_profiling_window_seconds") == {str(g): 10.0 for g in range(8)}
    supported = {(s.labels["gpu"], s.labels["reason"]): s.value
                 for s in found["gpu_profiling_supported"]}
    assert supported == {(str(g), "supported"): 1.0 for g in range(8)}


def test_idle_computes_nothing(running_exporter):
    found = scrape(running_exporter, "idle")
    tensor = by_gpu(found, "gpu_tensor_active_ratio")
    assert len(tensor) == 8 and all(v < 0.05 for v in tensor.values())
    assert all(v == 0.0 for v in by_gpu(found, "gpu_sm_active_ratio").values())


def test_the_interval_is_an_option(running_exporter):
    found = scrape(running_exporter, "training", seconds=6, profiling_interval_seconds=2)
    assert set(by_gpu(found, "gpu_profiling_window_seconds").values()) == {2.0}


def test_before_hopper_the_ratios_are_absent_and_the_reason_is_given(running_exporter):
    found = scrape(running_exporter, "retired-pages")  # 8x V100: `gpm: false`
    assert "gpu_tensor_active_ratio" not in found
    assert {(s.labels["reason"], s.value) for s in found["gpu_profiling_supported"]} == {
        ("unsupported_device", 0.0)}
    success = {s.labels["source"]: s.value for s in found["cte_source_success"]}
    assert success["profiling"] == 1.0  # no GPM is not a failure
    assert by_gpu(found, "gpu_up") == {str(g): 1.0 for g in range(8)}


MIG = """
gpus: 4
workload: {type: training}
events:
  - {kind: error, at: 0, gpu: 2, call: nvmlGpmSampleGet, error: NoPermission}
"""


def test_no_permission_on_one_gpu_leaves_the_others(running_exporter, tmp_path):
    path = tmp_path / "mig.yaml"
    path.write_text(MIG)
    found = scrape(running_exporter, str(path))
    reasons = {s.labels["gpu"]: (s.labels["reason"], s.value)
               for s in found["gpu_profiling_supported"]}
    assert reasons == {"0": ("supported", 1.0), "1": ("supported", 1.0),
                       "2": ("no_permission", 0.0), "3": ("supported", 1.0)}
    assert sorted(by_gpu(found, "gpu_tensor_active_ratio")) == ["0", "1", "3"]


FLAKY = """
gpus: 2
workload: {type: training}
events:
  - {kind: error, at: 7, until: 11, call: nvmlGpmMetricsGet, error: Unknown}
"""


def test_a_failed_metrics_call_leaves_out_that_interval_only(running_exporter, tmp_path):
    path = tmp_path / "flaky.yaml"
    path.write_text(FLAKY)
    exp = running_exporter.start(manual=True, scenario=str(path), profiling_interval_seconds=2)
    exp.sampler.advance(9)  # the read at 8 s failed
    found = samples(http_get(exp.port)[1])
    assert "gpu_tensor_active_ratio" not in found  # no stale values
    assert {s.labels["reason"] for s in found["gpu_profiling_supported"]} == {"supported"}
    errors = {(s.labels["call"], s.labels["error"]) for s in found["cte_nvml_errors_total"]}
    assert ("nvmlGpmMetricsGet", "Unknown") in errors
    exp.sampler.advance(4)  # the read at 12 s covers 10-12 s
    found = samples(http_get(exp.port)[1])
    assert by_gpu(found, "gpu_profiling_window_seconds") == {"0": 2.0, "1": 2.0}


def test_a_driver_without_gpm_says_so(running_exporter, monkeypatch):
    monkeypatch.delattr(GpmSymbols, "_nvmlGpmQueryDeviceSupport")
    found = scrape(running_exporter, "training", seconds=12)
    assert {s.labels["reason"] for s in found["gpu_profiling_supported"]} == {
        "unsupported_driver"}
    assert "gpu_sm_active_ratio" not in found


def test_a_lost_gpu_leaves_the_profiling_families(running_exporter):
    found = scrape(running_exporter, "gpu-lost", seconds=30)  # GPU 5 lost at 10 s
    assert "5" not in by_gpu(found, "gpu_profiling_supported")
    assert "5" not in by_gpu(found, "gpu_tensor_active_ratio")
    assert len(by_gpu(found, "gpu_tensor_active_ratio")) == 7


def test_the_driver_counters_and_memory_figures(running_exporter):
    found = scrape(running_exporter, "straggler", seconds=12, energy_interval_seconds=5,
                   metrics_profile="full")
    driver = {(s.labels["gpu"], s.labels["reason"]): s.value
              for s in found["gpu_clock_event_driver_seconds_total"]}
    # HW thermal slowdown on GPU 5 from the start; the counter is read every energy
    # interval (5 s here)
    assert 7 <= driver[("5", "hw_thermal_slowdown")] <= 12
    assert driver[("5", "thermal")] >= driver[("5", "hw_thermal_slowdown")]
    assert driver[("4", "hw_thermal_slowdown")] == 0.0
    free, reserved = (by_gpu(found, name) for name in ("gpu_memory_free_bytes",
                                                        "gpu_memory_reserved_bytes"))
    total, used = (by_gpu(found, name) for name in ("gpu_memory_total_bytes",
                                                    "gpu_memory_used_bytes"))
    for g in total:
        assert 0 < reserved[g] < free[g] < total[g]
        assert free[g] == pytest.approx(total[g] - used[g])  # v1 `used` includes reserved
    assert set(by_gpu(found, "gpu_encoder_utilization_ratio").values()) == {0.0}


# --------------------------------------------------------------- the fake's GPM, by phase

@contextmanager
def readers(scenario):
    clock = ManualClock()
    with fake.installed(scenario, clock, costs=None) as lib:
        backend = NvmlBackend()
        count = backend.open()
        try:
            yield [gpm.GpmReader(backend, g) for g in range(count)], clock, lib
        finally:
            backend.close()


def between(reader: gpm.GpmReader, clock: ManualClock, t0: float, t1: float) -> dict:
    """The metrics between samples at t0 and t1 (seconds after the clock's start)."""
    start = ManualClock().now
    clock.now = start + t0
    reader.restart()
    assert reader.read(clock.now) is None  # a first sample only starts the interval
    clock.now = start + t1
    reading = reader.read(clock.now)
    assert reading is not None and reading.end - reading.start == pytest.approx(t1 - t0)
    return dict(reading.values)


def test_compute_shows_tensor_activity_and_a_collective_none():
    # training: 2 s steps in phase with the clock, compute from 0.04 s to 1.34 s of each
    with readers(load_scenario("training")) as (rs, clock, _):
        compute = between(rs[0], clock, 0.2, 1.2)
        collective = between(rs[0], clock, 1.45, 1.95)
    assert compute["tensor_active_ratio"] > 0.6 and compute["sm_active_ratio"] > 0.8
    assert collective["tensor_active_ratio"] == 0.0
    assert 0.1 < collective["sm_active_ratio"] < 0.4  # NCCL keeps a few SMs busy
    assert collective["graphics_engine_active_ratio"] > 0.9


def test_a_checkpoint_stops_the_writer_while_its_peers_spin():
    # checkpoints: 20 s every 60 s of wall time; the manual clock starts 20 s into a minute
    with readers(load_scenario("checkpoint-stall")) as (rs, clock, _):
        writer = between(rs[0], clock, 41, 59)
        peer = between(rs[3], clock, 41, 59)
    assert writer["graphics_engine_active_ratio"] < 0.05 and writer["sm_active_ratio"] < 0.05
    assert peer["tensor_active_ratio"] == 0.0 and peer["graphics_engine_active_ratio"] > 0.9
    assert 0.1 < peer["sm_active_ratio"] < 0.3


def test_the_straggler_computes_while_its_peers_wait():
    with readers(load_scenario("straggler")) as (rs, clock, _):
        shares = {g: gpm.compute_share(between(r, clock, 0, 30)) for g, r in enumerate(rs)}
    peers = [shares[g] for g in range(8) if g != 5]
    assert max(peers) - min(peers) < 0.01
    assert shares[5] > max(peers) + 0.05


def test_samples_alternate_two_buffers_that_are_freed_at_the_end():
    with readers(load_scenario("training")) as (rs, clock, lib):
        reader = rs[0]
        for _ in range(5):
            reader.read(clock.now)
            clock.advance(3)
        assert len(lib._gpm_samples) == 2
        assert lib.calls["nvmlGpmQueryDeviceSupport"] == 1  # asked once
        assert lib.calls["nvmlGpmMetricsGet"] == 4
        reader.close()
        assert lib._gpm_samples == {}


# --------------------------------------------------------------- the compute signal

FAST = StragglerSettings(window_seconds=20, update_seconds=2, persistence_seconds=4)


def test_live_straggler_analysis_takes_the_compute_share():
    clock = ManualClock()
    maker = CollectorMaker("profiling", 2.0, lambda context: ProfilingCollector(context))
    with fake.installed(load_scenario("straggler"), clock, costs=None) as lib:
        sampler = Sampler(NvmlBackend(), SamplerSettings(stragglers=FAST, power=None,
                                                         xid_events=False),
                          [maker], clock=clock)
        sampler.start(threads=False)
        try:
            sampler.advance(24)
            report = sampler.build_snapshot().straggler_analysis.report
        finally:
            sampler.stop()
        assert lib._gpm_samples == {}  # the sampler freed the collector's GPM buffers
    compute = report.gpus[5].scores["compute"]
    assert compute.outlier and compute.direction == "high"
    assert "compute" in report.gpus[5].signals
    assert not any(report.gpus[g].scores["compute"].deviating for g in range(8) if g != 5)


def test_analyze_compares_the_compute_share_of_a_trace(tmp_path: Path, capsys):
    path = tmp_path / "profiled.cte"
    t = 1_758_000_000.0 + np.arange(0, 400, 0.1)
    high = (t % 2.0) < 1.3
    with TraceWriter(path, range(8), {g: 700.0 for g in range(8)},
                     ["power_watts", "tensor_active_ratio", "sm_active_ratio"]) as w:
        for g in range(8):
            for ti, hi in zip(t, high, strict=True):
                w.write(float(ti), g, {"power_watts": 650.0 if hi else 200.0})
            for end in t[99::100]:  # a profiling row every 10 s
                w.write(float(end), g, {"tensor_active_ratio": 0.52 if g == 5 else 0.43,
                                        "sm_active_ratio": 0.6})
    assert analyze.main(analyze.build_parser().parse_args(
        [str(path), "--format", "json"])) == 0
    import json

    rep = json.loads(capsys.readouterr().out)
    assert [(o["gpu"], o["signal"], o["direction"]) for o in rep["outliers"]] == [
        (5, "compute", "high")]
    assert not any("profiling" in n for n in rep["notes"])


def test_compute_share_is_the_busiest_math_pipe():
    assert gpm.compute_share({"tensor_active_ratio": 0.1, "fp64_active_ratio": 0.7,
                              "sm_active_ratio": 0.9}) == 0.7
    assert gpm.compute_share({"sm_active_ratio": 0.9}) is None
    assert scenario_from_yaml("device: {gpm: false}").device.gpm is False


def test_bindings_without_gpm_count_as_a_driver_without_it(fake_nvml, monkeypatch):
    import pynvml

    monkeypatch.delattr(pynvml, "nvmlGpmQueryDeviceSupport")
    backend = NvmlBackend()
    backend.open()
    reader = gpm.GpmReader(backend, 0)
    assert reader.read(1.0) is None and reader.status == gpm.UNSUPPORTED_DRIVER
    assert reader.read(2.0) is None
    assert backend.errors.totals() == {("nvmlGpmQueryDeviceSupport", "FunctionNotFound"): 1}
    backend.close()


def test_gpm_pcie_rates_are_bytes_per_second_over_the_interval():
    """GPM's PCIe rates (MiB/s in NVML) come in bytes per second, beside the ratios; on a
    whole GPU only, and a driver without them is asked once."""
    from exporter.sim.scenarios import Workload

    with readers(load_scenario("training")) as (rs, clock, _):
        start = ManualClock().now
        clock.now = start + 1.0
        rs[0].read(clock.now)
        clock.now = start + 11.0
        reading = rs[0].read(clock.now)
        assert reading is not None
        rate = Workload().pcie_bytes_per_second
        assert reading.rates["pcie_transmit_bytes_per_second"] == pytest.approx(0.55 * rate,
                                                                               rel=1e-6)
        assert reading.rates["pcie_receive_bytes_per_second"] == pytest.approx(0.45 * rate,
                                                                              rel=1e-6)
        assert set(reading.values) == set(gpm.KEYS)  # the ratios are as before
        assert gpm.GpmMigReader.rates == ()


def test_a_driver_without_gpm_pcie_rates_is_asked_once(monkeypatch):
    import exporter.sim.fake_gpm as fake_gpm

    monkeypatch.setattr(fake_gpm, "_PCIE_COUNTER", {})  # an older driver: NotSupported
    with readers(load_scenario("training")) as (rs, clock, lib):
        start = ManualClock().now
        for t in (1.0, 3.0, 5.0, 7.0):
            clock.now = start + t
            reading = rs[0].read(clock.now)
        assert reading is not None and reading.rates == {} and reading.values
        assert rs[0].rates == ()
        errors = rs[0].backend.errors.totals()
        assert errors[("nvmlGpmMetricsGet(pcie_transmit_bytes_per_second)",
                       "NotSupported")] == 1
