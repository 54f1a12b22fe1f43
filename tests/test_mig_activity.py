"""Per MIG GPU instance: GPM activity (nvmlGpmMigSampleGet) and the GPU's energy split
between its instances, on the fake's `mig` scenario at the default profile."""

from __future__ import annotations

import math
import re

import pytest

from exporter.collectors.profiling.mig import split_by_activity
from exporter.gpu import gpm
from exporter.gpu.backend import NvmlBackend
from exporter.sampling.clock import ManualClock
from exporter.sim import fake
from exporter.sim.scenarios import load_scenario
from tests.tools import http_get, samples

RATIOS = ("gpu_mig_graphics_engine_active_ratio", "gpu_mig_sm_active_ratio",
          "gpu_mig_sm_occupancy_ratio", "gpu_mig_tensor_active_ratio",
          "gpu_mig_dram_active_ratio")


def by_instance(found: dict, name: str) -> dict[tuple[str, str], float]:
    return {(s.labels["gpu"], s.labels["gpu_instance"]): s.value for s in found.get(name, [])}


def scrape(exp) -> dict:
    response, body = http_get(exp.port)
    assert response.status == 200
    return samples(body)


def test_split_by_activity_weighs_slices_and_keeps_the_rest_idle():
    parts, idle = split_by_activity(700.0, {1: (3, 1.0), 5: (2, 0.5), 14: (1, 0.0)})
    assert parts == pytest.approx({1: 300.0, 5: 100.0, 14: 0.0})
    assert idle == pytest.approx(300.0)
    # bad data: NaN and negative activity count as 0, weights past 1 are scaled to 1
    parts, idle = split_by_activity(70.0, {1: (7, 1.0), 2: (7, 1.0), 3: (1, math.nan),
                                           4: (1, -1.0)})
    assert parts == pytest.approx({1: 35.0, 2: 35.0, 3: 0.0, 4: 0.0}) and idle == 0.0
    assert split_by_activity(0.0, {}) == ({}, 0.0)


def test_each_instance_has_its_own_activity_and_the_notebook_comes_and_goes(
        running_exporter):
    exp = running_exporter.start(manual=True, scenario="mig")
    exp.sampler.advance(20)  # profiling reads at 0, 10, 20: the notebook ran all of (10, 20]
    during = scrape(exp)
    exp.sampler.advance(20)  # (30, 40]: the notebook runs 5-25 s of every minute
    after = scrape(exp)
    for name in RATIOS:
        assert sorted(by_instance(during, name)) == [
            ("0", "1"), ("0", "13"), ("0", "14"), ("0", "5"), ("1", "1"), ("1", "2")], name
    sm = by_instance(during, "gpu_mig_sm_active_ratio")
    # python (sm_util 0.8) > vllm (0.4) > the notebook (0.2) > an instance with nothing
    assert sm[("0", "1")] > sm[("0", "5")] > sm[("0", "13")] > 0.0
    assert sm[("0", "14")] == 0.0
    assert by_instance(after, "gpu_mig_sm_active_ratio")[("0", "13")] == 0.0
    assert by_instance(after, "gpu_mig_tensor_active_ratio")[("0", "1")] > 0.5
    # the MIG GPUs have no whole-GPU ratios (device-level GPM needs root in MIG mode),
    # and their profiling support says so by the instances' answer
    whole = {s.labels["gpu"] for s in during["gpu_sm_active_ratio"]}
    assert whole == {str(g) for g in range(2, 8)}
    supported = {s.labels["gpu"]: s.labels["reason"] for s in during["gpu_profiling_supported"]}
    assert supported["0"] == supported["1"] == "supported"


def test_the_energy_parts_add_up_to_the_gpus_energy(running_exporter):
    exp = running_exporter.start(manual=True, scenario="mig")
    exp.sampler.advance(20)
    first = scrape(exp)
    exp.sampler.advance(40)
    second = scrape(exp)
    gpu_energy = {s.labels["gpu"]: s.value
                  for s in second["gpu_power_sampled_energy_joules_total"]}
    gpu_before = {s.labels["gpu"]: s.value
                  for s in first["gpu_power_sampled_energy_joules_total"]}
    parts, parts_before = (by_instance(f, "gpu_mig_energy_joules_total")
                           for f in (second, first))
    assert {gpu for gpu, _ in parts} == {"0", "1"}  # only MIG GPUs are split
    for gpu in ("0", "1"):
        added = sum(v - parts_before.get(k, 0.0) for k, v in parts.items() if k[0] == gpu)
        measured = gpu_energy[gpu] - gpu_before[gpu]
        assert measured > 0
        assert added == pytest.approx(measured, rel=0.01)
    assert parts[("0", "14")] == 0.0  # no process, no activity, no energy
    assert parts[("0", "1")] > parts[("0", "5")] > parts[("0", "13")] > 0.0
    assert parts[("0", "idle")] > 0.0
    # the two equal instances of GPU 1 get equal shares
    assert parts[("1", "1")] == pytest.approx(parts[("1", "2")])


def test_a_destroyed_instance_frees_its_buffers_and_a_missing_one_is_not_found():
    clock = ManualClock()
    with fake.installed(load_scenario("mig"), clock, costs=None) as lib:
        backend = NvmlBackend()
        backend.open()
        try:
            reader = gpm.GpmMigReader(backend, 0, 13)
            assert reader.read(clock.now) is None  # the first sample starts the interval
            clock.now += 10
            reading = reader.read(clock.now)
            assert reading is not None and set(reading.values) == set(gpm.MIG_KEYS)
            missing = gpm.GpmMigReader(backend, 0, 9)  # no such GPU instance
            assert missing.read(clock.now) is None
            errors = set(backend.errors.totals())
            assert ("nvmlGpmMigSampleGet", "NotFound") in errors
            whole = gpm.GpmReader(backend, 0)
            assert whole.read(clock.now) is None and whole.status == gpm.NO_PERMISSION
            held = len(lib._gpm_samples)
            reader.close()
            missing.close()
            assert len(lib._gpm_samples) == held - 4
        finally:
            backend.close()


def test_the_mig_node_stays_within_the_standard_series_targets(running_exporter):
    """The targets of tests/test_selection.py (100 series per GPU plus 200 for the node),
    on the MIG node with its instances' activity and energy served: a GPU instance's own
    series (those with a `gpu_instance` label) at most 10 each, beside its GPU's."""
    exp = running_exporter.start(manual=True, scenario="mig")
    exp.sampler.advance(40)
    body = http_get(exp.port)[1].decode()
    series = [line for line in body.splitlines() if line and not line.startswith("#")]
    per_gpu = [line for line in series if '{gpu="' in line or ',gpu="' in line]
    per_instance = [line for line in per_gpu if 'gpu_instance="' in line]
    instances = {re.search(r'gpu="(\d+)".*gpu_instance="(\w+)"', line).groups()
                 for line in per_instance}
    assert any(line.startswith("gpu_mig_energy_joules_total") for line in series)
    assert len(per_gpu) - len(per_instance) <= 100 * 8
    assert len(series) - len(per_gpu) <= 200
    assert len(per_instance) <= 10 * len(instances)


def test_the_split_keeps_the_sum_through_a_destroyed_instance_and_an_energy_reset():
    """MigProfiler's split over reads, with the GPU's sampled energy set by the test."""
    from exporter.collectors.profiling.mig import MigProfiler
    from exporter.sampling.collector_api import CollectorContext

    state = {"energy": 1000.0}
    profiler = MigProfiler(CollectorContext(gpu_count=1,
                                            energy_joules=lambda gpu: state["energy"]))

    def reading(sm: float) -> gpm.GpmReading:
        return gpm.GpmReading(0.0, 10.0, {"sm_active_ratio": sm})

    first = profiler._split(0, {1: 3, 2: 4}, {})
    assert dict(first.instances) == {1: 0.0, 2: 0.0} and first.idle == 0.0  # the baseline
    state["energy"] = 1700.0
    second = profiler._split(0, {1: 3, 2: 4}, {1: reading(1.0), 2: reading(0.5)})
    assert second.instances[1] == pytest.approx(300.0)  # 700 x 3/7 x 1.0
    assert second.instances[2] == pytest.approx(200.0)  # 700 x 4/7 x 0.5
    assert second.idle == pytest.approx(200.0)
    state["energy"] = 2400.0  # instance 2 destroyed; 1 alone, a new 14 without a reading
    third = profiler._split(0, {1: 3, 14: 1}, {1: reading(1.0)})
    assert dict(third.instances) == pytest.approx({1: 600.0, 14: 0.0})
    assert third.idle == pytest.approx(200.0 + 400.0)
    state["energy"] = 50.0  # the GPU came back: its sampled energy restarted, a new baseline
    fourth = profiler._split(0, {1: 3, 14: 1}, {1: reading(1.0)})
    assert fourth.instances[1] == pytest.approx(600.0) and fourth.idle == pytest.approx(600.0)
    state["energy"] = 750.0
    fifth = profiler._split(0, {1: 3, 14: 1}, {1: reading(1.0), 14: reading(1.0)})
    assert dict(fifth.instances) == pytest.approx({1: 900.0, 14: 100.0})
    # every joule since the baseline is in a part; instance 2's 200 J went with its series
    # (its counter stops, so increase() over any window still adds up)
    assert fifth.instances[1] + fifth.instances[14] + fifth.idle + 200.0 == pytest.approx(
        700.0 + 700.0 + 700.0)


def test_the_device_check_times_the_mig_calls_where_a_gpu_is_in_mig_mode():
    """scripts/device_check.py measures the per-instance costs on a node already in MIG
    mode (here the fake's, charging its estimates) and says so where none is."""
    import sys

    from exporter.sim import costs
    from tests.tools import REPO

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from device_checks.gpm import mig_costs
    finally:
        sys.path.pop(0)

    def timed(fn, *args, repeat=1):
        import time as clock
        fn(*args)
        start = clock.thread_time()
        for _ in range(repeat):
            fn(*args)
        return {"p50_us": (clock.thread_time() - start) / repeat * 1e6}

    for scenario, expect_mig in (("mig", True), ("training", False)):
        with fake.installed(load_scenario(scenario), costs=costs.H200):  # real time
            backend = NvmlBackend()
            backend.open()
            try:
                found = mig_costs(backend, timed)
            finally:
                backend.close()
        if expect_mig:
            assert (found["gpu"], found["gpu_instance"]) == (0, 1)
            assert found["nvmlGpmMigSampleGet"]["p50_us"] >= 40  # the estimate charged
            assert found["nvmlGpmMetricsGet(5 metrics, MIG)"]["p50_us"] >= 1000
        else:
            assert found == {"status": "no GPU in MIG mode: the per-instance costs stay "
                                       "estimates"}
