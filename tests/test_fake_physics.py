"""The fake's node behaves like the hardware it stands for."""

from __future__ import annotations

import numpy as np
import pynvml
import pytest

from exporter.sim import fake
from exporter.sim.scenarios import load_scenario


def _instant_watts(handle) -> float:
    (value,) = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_POWER_INSTANT])
    assert value.nvmlReturn == 0
    return value.value.uiVal / 1000


def _energy_joules(handle) -> float:
    return pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000


def test_training_alternates_compute_and_communication_in_phase(fake_nvml, clock):
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    series = []
    for _ in range(400):  # 20 s at 20 Hz
        clock.advance(0.05)
        series.append([_instant_watts(h) for h in handles])
    power = np.array(series)
    assert power.max() <= 700 + 50 and power.max() > 600
    assert np.percentile(power, 5) < 260
    high = power > 435
    # all GPUs are in the same phase nearly always (noise only flips samples near the ramps)
    agreement = (high == high[:, :1]).mean()
    assert agreement > 0.95
    # share of time computing matches the scenario's compute fraction (0.65)
    assert abs(high.mean() - 0.65) < 0.06


def test_energy_counter_integrates_power_and_never_decreases(fake_nvml, clock):
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(2)
    start = _energy_joules(handle)
    readings, instants = [start], []
    for _ in range(200):
        clock.advance(0.05)
        readings.append(_energy_joules(handle))
        instants.append(_instant_watts(handle))
    assert all(b >= a for a, b in zip(readings, readings[1:], strict=False))
    mean_power = (readings[-1] - start) / 10.0
    assert mean_power == pytest.approx(np.mean(instants), rel=0.05)


def test_power_usage_is_a_one_second_average(fake_nvml, clock):
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    clock.advance(30)
    instants = []
    for _ in range(20):
        clock.advance(0.05)
        instants.append(_instant_watts(handle))
    average = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000
    assert average == pytest.approx(np.mean(instants), rel=0.08)
    spread = max(instants) - min(instants)
    assert spread > 200  # instant swings within the second; the average hides it


def test_idle_is_flat_and_reports_idle_clock_reason(clock):
    with fake.installed(load_scenario("idle"), clock):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        values = []
        for _ in range(100):
            clock.advance(0.05)
            values.append(_instant_watts(handle))
        assert np.ptp(values) < 20
        assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle) & 0x1
        assert pynvml.nvmlDeviceGetUtilizationRates(handle).gpu == 0


def test_temperature_follows_load(clock):
    with fake.installed(load_scenario("idle"), clock):
        pynvml.nvmlInit()
        clock.advance(60)
        idle = pynvml.nvmlDeviceGetTemperature(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
    with fake.installed(load_scenario("training"), clock):
        pynvml.nvmlInit()
        clock.advance(60)
        busy = pynvml.nvmlDeviceGetTemperature(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
    assert busy > idle + 15


def test_instant_power_holds_between_sensor_updates(fake_nvml, clock):
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    clock.now = 1_790_000_000.001  # just after a 50 ms sensor tick
    first = _instant_watts(handle)
    clock.advance(0.04)
    assert _instant_watts(handle) == first
    clock.advance(0.02)
    assert _instant_watts(handle) != first


def test_identity_is_stable_and_distinct(fake_nvml):
    pynvml.nvmlInit()
    uuids = {pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(8)}
    assert len(uuids) == 8 and all(u.startswith("GPU-") for u in uuids)
    bus = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).busId
    assert bus == "00000000:18:00.0"
