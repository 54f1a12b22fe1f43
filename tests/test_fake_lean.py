"""The fake's shortcuts answer what it would work out afresh: kept field answers, model
values that stand still, drains found without arrays, waveforms shared between GPUs; and
its accounts without a cost model."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np
import pynvml
import pytest

from exporter.gpu import catalogue
from exporter.gpu import fields as fi
from exporter.gpu.batched import SAMPLE_DTYPE
from exporter.gpu.device_read import device_read_requests
from exporter.sampling.clock import ManualClock
from exporter.sim import fake
from exporter.sim.fake_model import FAULT_KEYS, STATIC_KEYS
from exporter.sim.physics import HANDLE_BASE, step_timing
from exporter.sim.scenarios import load_scenario

SCENARIOS = sorted(p.stem for p in (Path(fake.__file__).parents[1] / "scenarios").glob("*.yaml"))
TIMES = (0.0, 7.0, 30.0, 95.0, 400.0, 1300.0)  # before, during and after the faults


def _lib(name: str) -> tuple[fake.FakeNvmlLibrary, ManualClock]:
    clock = ManualClock()
    lib = fake.FakeNvmlLibrary(load_scenario(name), clock, costs=None)
    lib.initialized = 1
    return lib, clock


def _handle(gpu: int) -> pynvml.c_nvmlDevice_t:
    return ctypes.cast(HANDLE_BASE + gpu, pynvml.c_nvmlDevice_t)


def _field_values(lib: fake.FakeNvmlLibrary, gpu: int, asked) -> tuple[int, bytes]:
    values = (pynvml.c_nvmlFieldValue_t * len(asked))()
    for i, (field_id, scope) in enumerate(asked):
        values[i].fieldId, values[i].scopeId = field_id, scope
    ret = lib.nvmlDeviceGetFieldValues(_handle(gpu), ctypes.c_int32(len(asked)),
                                       ctypes.byref(values))
    return ret, bytes(values)


@pytest.mark.parametrize("name", SCENARIOS)
def test_field_values_answer_as_a_library_that_never_asked_before(name):
    """The kept answers and packed entries of a request are what a new library answers."""
    lib, clock = _lib(name)
    nvlinks = lib.scenario.device.nvlinks
    sweep = [e.nvml.id for e in catalogue.of_cadence(catalogue.SWEEP)
             if isinstance(e.nvml, catalogue.Field)]
    requests = [tuple((r, 0) if isinstance(r, int) else r for r in
                      [*device_read_requests(nvlinks), fi.POWER_INSTANT]),
                tuple((f, 0) for f in sweep)]
    for t in TIMES:
        clock.advance(t - (clock.time() - lib.start))
        fresh = fake.FakeNvmlLibrary(lib.scenario, clock, costs=None, start=lib.start)
        fresh.initialized = 1
        for gpu in range(len(lib.gpus)):
            for asked in requests:
                assert _field_values(lib, gpu, asked) == _field_values(fresh, gpu, asked), (
                    name, t, gpu)


def test_field_values_with_a_negative_count_is_an_invalid_argument():
    lib, _ = _lib("training")
    values = (pynvml.c_nvmlFieldValue_t * 2)()
    assert lib.nvmlDeviceGetFieldValues(_handle(0), ctypes.c_int32(-1),
                                        ctypes.byref(values)) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert lib.nvmlDeviceGetFieldValues(_handle(0), ctypes.c_int32(0),
                                        ctypes.byref(values)) == pynvml.NVML_SUCCESS


@pytest.mark.parametrize("name", SCENARIOS)
def test_values_said_to_stand_still_do(name):
    """STATIC_KEYS never change; FAULT_KEYS do not without a fault of their kind."""
    lib, clock = _lib(name)
    keys = [*STATIC_KEYS, *(k for k, kind in FAULT_KEYS.items() if kind not in lib.fault_kinds)]
    first: dict[tuple[int, str], float | None] = {}
    for t in TIMES:
        clock.advance(t - (clock.time() - lib.start))
        for gpu in lib.gpus:
            for key in keys:
                value = lib.model(gpu, key)
                assert first.setdefault((gpu.index, key), value) == value, (name, t, key)
    assert set(STATIC_KEYS) | set(FAULT_KEYS) <= set(catalogue.BY_KEY)


def test_gpus_of_one_step_shape_share_one_waveform():
    """8 GPUs in lockstep share one waveform (its grid and integral: 32 KiB); a slower one
    (straggler) has its own, and the values are each GPU's own."""
    lockstep, _ = _lib("training")
    assert len({id(gpu.wave) for gpu in lockstep.gpus}) == 1
    straggler, _ = _lib("straggler")
    waves = {id(gpu.wave): gpu.wave for gpu in straggler.gpus}
    assert len(waves) >= 2
    timing = step_timing(straggler.scenario)
    for gpu in straggler.gpus:  # each GPU's waveform is the one of its own step
        period, fraction = timing[gpu.index]
        assert (gpu.wave.period, gpu.wave.breaks[2]) == (period, period * fraction)
        assert gpu.wave.levels[1] == gpu.high


@pytest.mark.parametrize("name", ["training", "checkpoint-stall", "unsynchronised"])
def test_a_drain_returns_the_newest_samples_stamped_after_last_seen(name):
    """Every sample the driver took after `last_seen` (up to the buffer's newest
    `capacity`), as the per-sample functions stamp and value them, whatever last_seen is:
    a sample's own stamp, a microsecond before it, long ago or in the future."""
    lib, clock = _lib(name)
    clock.advance(95.0)
    capacity = lib.scenario.device.power_sample_buffer
    gpu = lib.gpus[1]
    now = lib.now()
    newest = gpu.samples_between(now - 10, now)[-1]
    stamp = gpu.sample_stamp
    for seen in (0, stamp(newest - 30), stamp(newest - 30) - 1, stamp(newest - 5) + 1,
                 stamp(newest), stamp(newest) + 10**9, int((now - 1.0) * 1e6)):
        samples = (pynvml.c_nvmlSample_t * 256)()
        count, kind = ctypes.c_uint(256), ctypes.c_uint()
        ret = lib.nvmlDeviceGetSamples(_handle(1), fi.TOTAL_POWER_SAMPLES,
                                       ctypes.c_ulonglong(seen), ctypes.byref(kind),
                                       ctypes.byref(count), samples)
        span = gpu.samples_between(now - 2 * capacity * gpu.sample_interval, now)
        expected = [k for k in span if stamp(k) > seen][-capacity:]
        if not expected:
            assert ret == pynvml.NVML_ERROR_NOT_FOUND, seen
            continue
        assert ret == pynvml.NVML_SUCCESS and count.value == len(expected), seen
        view = np.frombuffer(bytes(samples), SAMPLE_DTYPE)[:count.value]
        assert view["timeStamp"].tolist() == [stamp(k) for k in expected]
        assert view["value"].tolist() == [round(gpu.sample_watts_exact(k) * 1000)
                                          for k in expected]
        asked = ctypes.c_uint(0)  # pynvml's first call: how many there are, without them
        assert lib.nvmlDeviceGetSamples(_handle(1), fi.TOTAL_POWER_SAMPLES,
                                        ctypes.c_ulonglong(seen), ctypes.byref(kind),
                                        ctypes.byref(asked), None) == pynvml.NVML_SUCCESS
        assert asked.value == len(expected)


def test_without_a_cost_model_each_thread_counts_its_cpu_and_no_charge():
    lib, _ = _lib("training")
    ident, before = threading.get_ident(), lib.busy_by_thread.get(threading.get_ident(), 0.0)
    temperature = ctypes.c_uint()
    for _ in range(2000):
        assert lib.nvmlDeviceGetTemperature(_handle(0), 0, ctypes.byref(temperature)) == 0
    assert lib.calls["nvmlDeviceGetTemperature"] == 2000
    assert lib.busy_by_thread[ident] > before  # the fake's own Python, in CPU seconds
    assert lib.modelled_by_thread[ident] == 0.0
    assert lib.busy_seconds == pytest.approx(sum(lib.busy_by_thread.values()))


