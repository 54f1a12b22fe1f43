"""The NVML backend and GPU source on the fake: values, batching, errors counted."""

from __future__ import annotations

import pytest

from exporter.gpu.backend import NvmlBackend, NvmlUnavailable
from exporter.gpu.state import POWER_FIELDS, read_identity, read_power, read_state
from exporter.sim import fake
from tests.tools import scenario_from_yaml


def test_identity(fake_nvml):
    backend = NvmlBackend()
    assert backend.open() == 8
    ident = read_identity(backend, 5)
    assert ident.index == 5
    assert ident.name == "NVIDIA H100 80GB HBM3"
    assert ident.uuid.startswith("GPU-")
    assert ident.pci_bus_id == "00000000:AB:00.0"
    assert ident.default_power_limit_watts == 700
    assert ident.pcie_max_generation == 5 and ident.pcie_max_width == 16
    assert backend.driver_version == "570.133.20"
    assert backend.nvml_version == "12.570.133.20"


def test_state_values_have_base_units(fake_nvml, clock):
    backend = NvmlBackend()
    backend.open()
    clock.advance(40)
    state = read_state(backend, 0)
    assert state.utilization_gpu_ratio == 1.0
    assert 0 <= state.utilization_memory_ratio <= 1
    assert state.memory_total_bytes == 81559 * 1024 * 1024
    assert 0 < state.memory_used_bytes <= state.memory_total_bytes
    assert 150 < state.power_average_watts < 700
    assert state.power_limit_watts == 700
    assert 40 < state.temperature_celsius < 90
    assert state.memory_temperature_celsius > state.temperature_celsius
    assert state.sm_clock_hertz >= 1.5e9
    assert state.memory_clock_hertz == 2619e6
    assert state.performance_state == 0
    assert state.fan_speed_ratio is None  # not supported on SXM: left out, counted
    assert state.pcie_transmit_bytes > 0 and state.pcie_receive_bytes > 0
    assert state.pcie_replays == 0
    assert (state.pcie_generation, state.pcie_width) == (5, 16)


def test_power_sample_batches_instant_power_and_energy_in_one_call(fake_nvml):
    backend = NvmlBackend()
    backend.open()
    before = fake_nvml.calls.get("nvmlDeviceGetFieldValues", 0)
    sample = read_power(backend, 1)
    assert fake_nvml.calls["nvmlDeviceGetFieldValues"] == before + 1
    assert len(POWER_FIELDS) == 2
    assert 0 < sample.watts < 800
    assert sample.joules > 1e6


ERRORS_ON_GPU_2 = """
gpus: 4
events:
  - {kind: error, at: 0, gpu: 2, call: nvmlDeviceGetTemperature, error: Unknown}
  - {kind: error, at: 0, gpu: 2, call: nvmlDeviceGetMemoryInfo, error: NoPermission}
  - {kind: error, at: 0, gpu: 2, call: nvmlDeviceGetFieldValues, error: GpuIsLost}
  - {kind: error, at: 10, until: 20, call: nvmlDeviceGetUtilizationRates, error: Timeout}
"""


def test_errors_are_counted_by_call_and_name_and_hide_nothing_else(clock):
    scenario = scenario_from_yaml(ERRORS_ON_GPU_2)
    with fake.installed(scenario, clock):
        backend = NvmlBackend()
        backend.open()
        states = {gpu: read_state(backend, gpu) for gpu in range(4)}
        assert states[2].temperature_celsius is None
        assert states[2].memory_used_bytes is None
        assert states[2].power_average_watts is None
        assert states[2].sm_clock_hertz is not None  # other calls on the failing GPU still work
        for gpu in (0, 1, 3):
            assert states[gpu].temperature_celsius is not None
            assert states[gpu].memory_used_bytes is not None
        assert read_power(backend, 2).watts is None
        assert read_power(backend, 3).watts is not None
        errors = backend.errors.snapshot()
        assert errors[("nvmlDeviceGetTemperature", "Unknown")] == 1
        assert errors[("nvmlDeviceGetMemoryInfo", "NoPermission")] == 1
        assert errors[("nvmlDeviceGetFieldValues", "GpuIsLost")] == 2
        # a fault window opens and closes with scenario time
        clock.advance(15)
        assert read_state(backend, 0).utilization_gpu_ratio is None
        clock.advance(10)
        assert read_state(backend, 0).utilization_gpu_ratio == 1.0


def test_per_field_errors_are_counted_with_the_field_name(fake_nvml):
    backend = NvmlBackend()
    backend.open()
    readings = backend.fields(0, [186, 123456])
    assert set(readings) == {186}
    assert backend.errors.snapshot() == {("nvmlDeviceGetFieldValues(123456)", "NotSupported"): 1}


def test_open_without_nvml_raises_a_clear_error():
    with pytest.raises(NvmlUnavailable, match="NVML is not available"):
        NvmlBackend().open()


def test_a_call_the_gpu_does_not_support_is_counted_once_and_not_repeated(fake_nvml):
    backend = NvmlBackend()
    backend.open()
    for _ in range(5):
        state = read_state(backend, 0)
        assert state.fan_speed_ratio is None
    assert fake_nvml.calls["nvmlDeviceGetFanSpeed"] == 1
    assert backend.errors.snapshot() == {("nvmlDeviceGetFanSpeed", "NotSupported"): 1}
    # other errors are not remembered: a transient one is asked again
    assert state.temperature_celsius is not None


def test_seldom_changing_values_are_carried_over_between_health_reads(fake_nvml):
    backend = NvmlBackend()
    backend.open()
    first = read_state(backend, 0)
    before = fake_nvml.calls["nvmlDeviceGetEnforcedPowerLimit"]
    second = read_state(backend, 0, previous=first)
    assert fake_nvml.calls["nvmlDeviceGetEnforcedPowerLimit"] == before
    assert (second.power_limit_watts, second.performance_state, second.pcie_generation,
            second.pcie_width) == (first.power_limit_watts, first.performance_state,
                                   first.pcie_generation, first.pcie_width)
    assert second.time >= first.time
