"""The NVML backend and the catalogue's reads on the fake: values, batching, errors."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pynvml
import pytest

from exporter.gpu import batched, catalogue
from exporter.gpu import fields as fi
from exporter.gpu.backend import NvmlBackend, NvmlUnavailable, field_name
from exporter.gpu.reading import GpuReading, read_gpu, read_identity
from exporter.sim import fake
from exporter.sim.fake_device import DeviceSymbols
from exporter.sim.scenarios import load_scenario
from tests.tools import scenario_from_yaml

ALL = catalogue.CADENCES


def test_identity(fake_nvml):
    backend = NvmlBackend()
    assert backend.open() == 8
    ident = read_identity(backend, 5)
    assert ident.index == 5
    assert ident.name == "NVIDIA H100 80GB HBM3"
    assert ident.uuid.startswith("GPU-")
    assert ident.pci_bus_id == "00000000:AB:00.0"
    assert ident.default_power_limit_watts == 700
    assert ident.values["pcie_max_generation"] == 5 and ident.values["pcie_max_width"] == 16
    assert ident.values["sm_clock_max_hertz"] == 1980e6
    assert ident.nvlinks == 18
    assert backend.driver_version == "570.133.20"
    assert backend.nvml_version == "12.570.133.20"


def test_state_values_have_base_units(fake_nvml, clock):
    backend = NvmlBackend()
    backend.open()
    clock.advance(40)
    state = read_gpu(backend, 0, clock(), ALL)
    get = state.get
    assert get("utilization_gpu_ratio") == 1.0
    assert 0 <= get("utilization_memory_ratio") <= 1
    assert get("memory_total_bytes") == 81559 * 1024 * 1024
    assert 0 < get("memory_used_bytes") <= get("memory_total_bytes")
    assert 150 < get("power_average_watts") < 700
    assert get("power_limit_watts") == 700
    assert 40 < get("temperature_celsius") < 90
    assert get("memory_temperature_celsius") > get("temperature_celsius")
    assert get("sm_clock_hertz") >= 1.5e9
    assert get("memory_clock_hertz") == 2619e6
    assert get("performance_state") == 0
    assert get("fan_speed_ratio") is None  # not supported on SXM: left out, counted
    assert get("pcie_transmit_bytes") > 0 and get("pcie_receive_bytes") > 0
    assert get("pcie_replays") == 0
    assert (get("pcie_generation"), get("pcie_width")) == (5, 16)
    assert get("energy_joules") > 1e6
    assert state.time == clock()


def test_each_cadence_reads_only_its_values_in_one_batched_call(fake_nvml, clock):
    backend = NvmlBackend()
    backend.open()
    calls = fake_nvml.calls
    before = dict(calls)
    state = read_gpu(backend, 0, clock(), [catalogue.SWEEP])
    assert calls["nvmlDeviceGetFieldValues"] == before.get("nvmlDeviceGetFieldValues", 0) + 1
    assert "energy_joules" not in state.values and "pcie_replays" not in state.values
    # one call serves the values that share it (utilization: gpu and memory)
    assert calls["nvmlDeviceGetUtilizationRates"] == before.get(
        "nvmlDeviceGetUtilizationRates", 0) + 1
    assert calls.get("nvmlDeviceGetEnforcedPowerLimit", 0) == before.get(
        "nvmlDeviceGetEnforcedPowerLimit", 0)


def test_values_of_cadences_not_due_are_carried_over(fake_nvml, clock):
    backend = NvmlBackend()
    backend.open()
    first = read_gpu(backend, 0, clock(), ALL)
    clock.advance(1)
    before = fake_nvml.calls["nvmlDeviceGetEnforcedPowerLimit"]
    second = read_gpu(backend, 0, clock(), [catalogue.SWEEP], previous=first)
    assert fake_nvml.calls["nvmlDeviceGetEnforcedPowerLimit"] == before
    for key in ("power_limit_watts", "performance_state", "pcie_generation", "energy_joules"):
        assert second.get(key) == first.get(key)
    assert second.time > first.time


MEMORY = ("memory_used_bytes", "memory_total_bytes", "memory_free_bytes",
          "memory_reserved_bytes")


def _memory_calls(lib: fake.FakeNvmlLibrary) -> tuple[int, int]:
    return (lib.calls.get("nvmlDeviceGetMemoryInfo", 0),
            lib.calls.get("nvmlDeviceGetMemoryInfo_v2", 0))


def _three_sweeps(backend: NvmlBackend, gpu: int, lib: fake.FakeNvmlLibrary, clock,
                  calls: tuple[int, int]) -> Iterator[GpuReading]:
    """Open the backend 40 s in, then three sweeps of the GPU a second apart, each making
    `calls` (version 1, version 2) memory calls."""
    backend.open()
    clock.advance(40)
    previous = None
    for _ in range(3):
        before = _memory_calls(lib)
        previous = read_gpu(backend, gpu, clock(), [catalogue.SWEEP], previous)
        assert previous is not None
        assert _memory_calls(lib) == (before[0] + calls[0], before[1] + calls[1])
        yield previous
        clock.advance(1)


def test_a_gpu_with_memory_info_v2_is_read_with_one_memory_call_a_sweep(fake_nvml, clock):
    """Version 2 of the memory call answers what version 1 does too (its total, and used as
    total - free): one call a GPU each sweep, the four values each call gives alone."""
    backend = NvmlBackend()
    for reading in _three_sweeps(backend, 3, fake_nvml, clock, (0, 1)):
        handle = pynvml.nvmlDeviceGetHandleByIndex(3)
        v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, catalogue.MEMORY_INFO_V2)
        assert [reading.get(key) for key in MEMORY] == [v1.used, v1.total, v2.free,
                                                        v2.reserved]
        assert v1.used == v2.total - v2.free > v2.reserved > 0
    assert backend.errors.totals() == {("nvmlDeviceGetFanSpeed", "NotSupported"): 1}


def test_both_memory_calls_agree_on_an_idle_gpu(clock):
    """An idle GPU holds less than the driver reserves: version 1's used is still
    total - free (the reservation counted in), as version 2 tells it."""
    with fake.installed(load_scenario("idle"), clock, costs=None):
        clock.advance(5)
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
            v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, catalogue.MEMORY_INFO_V2)
        finally:
            pynvml.nvmlShutdown()
        assert v2.used == 0 < v2.reserved
        assert (v1.total, v1.used, v1.free) == (v2.total, v2.total - v2.free, v2.free)


def test_a_driver_without_memory_info_v2_is_read_with_version_1(fake_nvml, clock, monkeypatch):
    """An older driver lacks the v2 symbol: asked once (counted as FunctionNotFound), then
    version 1 alone every sweep; the used and total bytes as before, free and reserved
    absent."""
    monkeypatch.delattr(DeviceSymbols, "_nvmlDeviceGetMemoryInfo_v2")
    backend = NvmlBackend()
    for reading in _three_sweeps(backend, 1, fake_nvml, clock, (1, 0)):
        v1 = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(1))
        assert [reading.get(key) for key in MEMORY] == [v1.used, v1.total, None, None]
    assert backend.errors.totals() == {
        ("nvmlDeviceGetFanSpeed", "NotSupported"): 1,
        ("nvmlDeviceGetMemoryInfo", "FunctionNotFound"): 1}


def test_memory_info_v2_not_supported_falls_back_to_version_1(clock):
    """A GPU that answers NotSupported for version 2: asked once, then version 1 alone."""
    scenario = scenario_from_yaml("""
gpus: 2
events:
  - {kind: error, at: 0, call: nvmlDeviceGetMemoryInfo_v2, error: NotSupported}
""")
    with fake.installed(scenario, clock, costs=None) as lib:
        backend = NvmlBackend()
        backend.open()
        readings = []
        for _ in range(3):
            readings.append(read_gpu(backend, 0, clock(), [catalogue.SWEEP]))
            clock.advance(1)
        assert _memory_calls(lib) == (3, 1)
        for reading in readings:
            assert reading.get("memory_total_bytes") == 81559 * 1024 * 1024
            assert 0 < reading.get("memory_used_bytes") < reading.get("memory_total_bytes")
            assert reading.get("memory_free_bytes") is None
            assert reading.get("memory_reserved_bytes") is None
        assert backend.errors.totals()[("nvmlDeviceGetMemoryInfo", "NotSupported")] == 1


ERRORS_ON_GPU_2 = """
gpus: 4
events:
  - {kind: error, at: 0, gpu: 2, call: nvmlDeviceGetTemperature, error: Unknown}
  - {kind: error, at: 0, gpu: 2, call: nvmlDeviceGetMemoryInfo_v2, error: NoPermission}
  - {kind: error, at: 0, gpu: 2, call: nvmlDeviceGetFieldValues, error: GpuIsLost}
  - {kind: error, at: 10, until: 20, call: nvmlDeviceGetUtilizationRates, error: Timeout}
"""


def test_errors_are_counted_by_call_and_name_and_hide_nothing_else(clock):
    scenario = scenario_from_yaml(ERRORS_ON_GPU_2)
    with fake.installed(scenario, clock, costs=None):
        backend = NvmlBackend()
        backend.open()
        states = {gpu: read_gpu(backend, gpu, clock(), ALL) for gpu in range(4)}
        assert states[2].get("temperature_celsius") is None
        assert states[2].get("memory_free_bytes") is None
        assert states[2].get("power_average_watts") is None
        # version 1 of the memory call is asked where version 2 failed: used and total stay
        assert states[2].get("memory_used_bytes") == states[0].get("memory_used_bytes")
        assert states[2].get("sm_clock_hertz") is not None  # other calls still work
        for gpu in (0, 1, 3):
            assert states[gpu].get("temperature_celsius") is not None
            assert states[gpu].get("memory_used_bytes") is not None
        assert 2 in backend.lost  # GpuIsLost marks the GPU lost
        errors = backend.errors.totals()
        assert errors[("nvmlDeviceGetTemperature", "Unknown")] == 1
        assert errors[("nvmlDeviceGetMemoryInfo", "NoPermission")] == 1
        assert errors[("nvmlDeviceGetFieldValues", "GpuIsLost")] == 1
        # a fault window opens and closes with scenario time
        clock.advance(15)
        assert read_gpu(backend, 0, clock(), ALL).get("utilization_gpu_ratio") is None
        clock.advance(10)
        assert read_gpu(backend, 0, clock(), ALL).get("utilization_gpu_ratio") == 1.0


def test_per_field_errors_are_counted_with_the_field_name(fake_nvml):
    backend = NvmlBackend()
    backend.open()
    readings = backend.fields(0, [fi.POWER_INSTANT, 123456])
    assert set(readings) == {fi.POWER_INSTANT}
    assert backend.errors.totals() == {("nvmlDeviceGetFieldValues(123456)", "NotSupported"): 1}
    # a field fields.NAMES does not list is named from nvidia-ml-py's constants
    assert "POWER_MAX_LIMIT" not in fi.NAMES.values()
    assert field_name(188) == "POWER_MAX_LIMIT" and field_name(123456) == "123456"
    assert field_name(fi.TOTAL_ENERGY) == "TOTAL_ENERGY_CONSUMPTION"
    # NAMES lists only the labels that differ from nvidia-ml-py's names, and keeps them
    assert not {fid for fid, name in fi.NAMES.items()
                if getattr(pynvml, f"NVML_FI_DEV_{name}", None) == fid}
    assert (field_name(fi.NVLINK_REPLAY), field_name(fi.NVLINK_CRC_DATA[6]),
            field_name(fi.VIOLATION_HW_THERMAL)) == (
        "NVLINK_REPLAY_ERRORS", "NVLINK_CRC_DATA_L6", "CLOCKS_EVENT_REASON_HW_THERMAL_SLOWDOWN")


def test_open_without_nvml_raises_a_clear_error():
    with pytest.raises(NvmlUnavailable, match="NVML is not available"):
        NvmlBackend().open()


def test_a_call_the_gpu_does_not_support_is_counted_once_and_not_repeated(fake_nvml, clock):
    backend = NvmlBackend()
    backend.open()
    for _ in range(5):
        state = read_gpu(backend, 0, clock(), ALL)
        assert state.get("fan_speed_ratio") is None
    assert fake_nvml.calls["nvmlDeviceGetFanSpeed"] == 1
    # an H200 has no fan, and row remapping in place of page retirement
    retired = ("RETIRED_SBE", "RETIRED_DBE", "RETIRED_PENDING")
    assert backend.errors.totals() == {
        ("nvmlDeviceGetFanSpeed", "NotSupported"): 1,
        **{(f"nvmlDeviceGetFieldValues({name})", "NotSupported"): 1 for name in retired}}
    assert state.get("temperature_celsius") is not None
    assert state.get("retired_pages_single_bit") is None


def test_a_field_the_gpu_does_not_support_is_asked_once(fake_nvml):
    """Retired pages (fields 29-31) are NotSupported on Hopper: asked once, not every
    health read, and counted once."""
    backend = NvmlBackend()
    backend.open()
    for _ in range(4):
        got = backend.fields(0, [fi.RETIRED_SBE, fi.RETIRED_DBE, fi.MEMORY_TEMP])
        assert set(got) == {fi.MEMORY_TEMP}
    errors = backend.errors.totals()
    assert errors == {("nvmlDeviceGetFieldValues(RETIRED_SBE)", "NotSupported"): 1,
                      ("nvmlDeviceGetFieldValues(RETIRED_DBE)", "NotSupported"): 1}


def test_power_samples_come_from_the_driver_buffer_in_order(fake_nvml, clock):
    backend = NvmlBackend()
    backend.open()
    clock.advance(1.0)
    stamps, milliwatts = backend.samples(0, fi.TOTAL_POWER_SAMPLES, 0)
    assert len(stamps) == 119  # the driver's whole buffer: it sampled before we asked
    assert (np.diff(stamps.astype(float)) > 0).all()  # in order, no duplicates
    assert ((milliwatts > 50_000) & (milliwatts < 800_000)).all()
    none_new = backend.samples(0, fi.TOTAL_POWER_SAMPLES, int(stamps[-1]))
    assert len(none_new[0]) == 0  # NotFound: nothing new
    clock.advance(0.5)
    newer, _ = backend.samples(0, fi.TOTAL_POWER_SAMPLES, int(stamps[-1]))
    assert len(newer) and newer[0] > stamps[-1]
    assert backend.errors.totals() == {}  # "nothing new" is not an error


def test_batched_reads_agree_with_pynvml_wrappers(fake_nvml, clock):
    """The numpy views of pynvml's structs read what pynvml's own wrappers read."""
    fast, slow = NvmlBackend(), NvmlBackend()
    fast.open()
    slow.open()
    slow._batched = False
    clock.advance(3)
    requests = [fi.POWER_AVERAGE, fi.MEMORY_TEMP, fi.TOTAL_ENERGY, (fi.NVLINK_STATE, 3),
                (fi.NVLINK_TX, 5), 123456]
    assert fast.scoped_fields(1, requests) == slow.scoped_fields(1, requests)
    # a request longer than batched.SMALL_REQUEST is read through numpy instead
    longer = requests + [(fid, link) for link in range(18)
                         for fid in (fi.NVLINK_RX, fi.NVLINK_RECOVERY, fi.NVLINK_CRC_FLIT)]
    assert len(longer) > batched.SMALL_REQUEST
    got = fast.scoped_fields(1, longer)
    assert got == slow.scoped_fields(1, longer) and len(got) == len(longer) - 1
    assert fast.errors.totals() == slow.errors.totals() == {
        ("nvmlDeviceGetFieldValues(123456)", "NotSupported"): 1}
    a, b = fast.samples(1, fi.TOTAL_POWER_SAMPLES, 0), slow.samples(1, fi.TOTAL_POWER_SAMPLES, 0)
    assert (a[0] == b[0]).all() and (a[1] == b[1]).all()


def test_field_values_read_each_value_type_as_the_union_holds_it():
    """Every nvmlValueType_t, alone and mixed in one batch, reads as pynvml's union does."""
    import ctypes

    import numpy as np
    import pynvml

    from exporter.gpu import batched

    members = [(pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", -2.75),
               (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 4_000_000_000),
               (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal", 2**40 + 3),
               (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**50 + 5),
               (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -(2**45)),
               (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -123456),
               (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal", 65000)]
    for order in (members, members[::-1], members[:1] * 3, members[3:4]):
        array = (pynvml.c_nvmlFieldValue_t * len(order))()
        for entry, (kind, member, value) in zip(array, order, strict=True):
            entry.value.ullVal = 0xDEADBEEF_DEADBEEF  # upper bytes the short types ignore
            setattr(entry.value, member, value)
            entry.valueType = kind
        raw = np.frombuffer(memoryview(array).cast("B"), batched.FIELD_DTYPE)
        expected = [float(getattr(entry.value, member))
                    for entry, (_, member, _) in zip(array, order, strict=True)]
        assert batched.field_values(raw).tolist() == expected
        assert ctypes.sizeof(array) == raw.nbytes
        # the short requests' plain-Python reading: the same floats, bit for bit
        python = [batched.union_value(int(kind), int(value))
                  for kind, value in zip(raw["valueType"], raw["value"], strict=True)]
        assert np.array_equal(np.array(python), np.array(expected))
        assert [math.copysign(1, v) for v in python] == [math.copysign(1, v) for v in expected]


def test_an_event_handle_after_a_reopen_is_not_taken_for_the_gpu_registered_before(fake_nvml):
    """Pointers registered for events name their GPUs until NVML is closed: a reopened NVML
    may hand the same pointer to another GPU, which is then found by its UUID."""
    backend = NvmlBackend()
    backend.open()
    event_set, registered = backend.register_xid_events()
    assert event_set is not None and registered == 8
    handle = backend.handle(0)
    uuid = backend.call("nvmlDeviceGetUUID", handle)
    assert backend.gpu_of(handle, {uuid: 5}) == 0  # registered: not asked its UUID
    backend.close()
    backend.open()
    assert backend.gpu_of(backend.handle(0), {uuid: 5}) == 5
    backend.register_xid_events()
    assert backend.gpu_of(backend.handle(0), {uuid: 5}) == 0
    backend.close()
