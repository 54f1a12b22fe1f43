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
    with fake.installed(load_scenario("idle"), clock, costs=None):
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
    with fake.installed(load_scenario("idle"), clock, costs=None):
        pynvml.nvmlInit()
        clock.advance(60)
        idle = pynvml.nvmlDeviceGetTemperature(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
    with fake.installed(load_scenario("training"), clock, costs=None):
        pynvml.nvmlInit()
        clock.advance(60)
        busy = pynvml.nvmlDeviceGetTemperature(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
    assert busy > idle + 15


def test_instant_power_holds_between_sensor_updates(fake_nvml, clock):
    """Field 186 changes every 100 ms on an H200: polling it faster reads values again."""
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    clock.now = 1_790_000_000.001  # just after a 100 ms sensor tick
    first = _instant_watts(handle)
    clock.advance(0.09)
    assert _instant_watts(handle) == first
    clock.advance(0.02)
    assert _instant_watts(handle) != first


def test_the_driver_buffers_power_samples_every_20_ms_with_jitter(fake_nvml, clock):
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(3)
    clock.advance(2.0)
    _, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_TOTAL_POWER_SAMPLES, 0)
    stamps = np.array([s.timeStamp for s in samples]) / 1e6
    gaps = np.diff(stamps)
    assert len(samples) == 119  # the whole buffer, ~2.4 s at ~50/s
    assert np.median(gaps) == pytest.approx(0.02, rel=0.15)
    assert gaps.min() < 0.012 and gaps.max() > 0.028  # jittered, as the driver's are
    watts = np.array([s.sampleValue.uiVal for s in samples]) / 1000
    assert watts.max() > 600 and watts.min() < 260  # the step swing is in the samples
    # the instant field shows the newest sample as of the sensor's last 100 ms update
    assert _instant_watts(handle) in set(watts)


def test_the_buffer_holds_119_samples_so_a_late_drain_loses_the_oldest(fake_nvml, clock):
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    clock.advance(1.0)
    _, first = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_TOTAL_POWER_SAMPLES, 0)
    last = first[-1].timeStamp
    clock.advance(2.0)  # well inside the ~2.4 s buffer: nothing lost
    _, soon = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_TOTAL_POWER_SAMPLES, last)
    assert (soon[0].timeStamp - last) / 1e6 < 0.05
    clock.advance(5.0)  # too late: only the newest 119 are left
    _, late = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_TOTAL_POWER_SAMPLES,
                                          soon[-1].timeStamp)
    assert len(late) == 119
    assert (late[0].timeStamp - soon[-1].timeStamp) / 1e6 > 2.0  # the first ~2.6 s are gone


def test_the_fake_charges_what_the_h200_charges():
    """The H200 figures of docs/nvml-costs.md: the energy read costs milliseconds, the instant field
    microseconds, a buffer drain a few tenths of a millisecond."""
    import time

    from exporter.sim.costs import H200

    assert H200.of_fields([pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]).wall >= 2.5e-3
    assert H200.of_fields([pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]).cpu >= 4e-3
    assert H200.of_fields([pynvml.NVML_FI_DEV_POWER_INSTANT]).wall < 0.5e-3
    assert H200.of_samples(50).wall >= 0.2e-3 and H200.of_samples(119).wall <= 1.5e-3
    with fake.installed(load_scenario("training")) as lib:  # costs on: the default
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        busy0, t0 = lib.busy_seconds, time.perf_counter()
        _energy_joules(handle)
        assert time.perf_counter() - t0 >= 2.5e-3  # charged in wall time
        assert lib.busy_seconds - busy0 >= 3e-3  # and in CPU, counted as the driver's


def test_the_fake_accounts_its_cpu_and_the_models_charge_per_thread():
    """bench_cpu splits each thread's CPU into the driver's and ours from these accounts;
    two threads at once must each get exactly what the model charged their calls."""
    import threading

    from exporter.sim.costs import H200

    energy = H200.of_fields([pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]).cpu
    temperature = H200.of_call("nvmlDeviceGetTemperature").cpu
    idents = []
    # both alive until both are done: a thread's ident is reused once it has ended, and
    # on a loaded machine the first could end before the second starts
    both_done = threading.Barrier(2)

    def calls(n: int) -> None:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for _ in range(n):
            pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
        _energy_joules(handle)
        idents.append(threading.get_ident())
        both_done.wait(30)

    with fake.installed(load_scenario("training")) as lib:
        pynvml.nvmlInit()
        threads = [threading.Thread(target=calls, args=(n,)) for n in (10, 30)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        charged = [lib.modelled_by_thread[i] for i in idents]
        busy = [lib.busy_by_thread[i] for i in idents]
    few, many = sorted(charged)  # (and each thread's one handle lookup)
    assert many - few == pytest.approx(20 * temperature)
    assert few == pytest.approx(10 * temperature + energy, abs=10e-6)
    assert all(b >= 0.9 * c for b, c in zip(busy, charged, strict=True))  # burnt, not just told
    assert lib.busy_seconds == pytest.approx(sum(lib.busy_by_thread.values()))
    assert lib.modelled_seconds >= sum(charged)


def test_the_fakes_own_python_is_given_back_by_the_threads_large_calls():
    """A cheap call's Python in the fake costs more than the H200's few us; the excess is
    a thread's credit, taken off its later large calls, so that its CPU inside the fake
    adds up to what the model charged (the sweep: ~80 cheap calls a second, 8 energy
    reads every 30 s, which must be able to take tens of ms of it back)."""
    import math
    import threading

    from exporter.sim.costs import H200

    energy = H200.of_fields([pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]).cpu
    accounts = {}

    def calls() -> None:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for _ in range(4000):
            pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
        ident = threading.get_ident()
        excess = lib.busy_by_thread[ident] - lib.modelled_by_thread[ident]
        for _ in range(math.ceil(excess / energy) + 1):  # enough to give it all back
            _energy_joules(handle)
        accounts.update(excess=excess, busy=lib.busy_by_thread[ident],
                        modelled=lib.modelled_by_thread[ident])

    with fake.installed(load_scenario("training")) as lib:
        pynvml.nvmlInit()
        thread = threading.Thread(target=calls)
        thread.start()
        thread.join()
    assert accounts["excess"] > 0  # the fake's Python: more than the model's 5 us a call
    assert accounts["busy"] == pytest.approx(accounts["modelled"], rel=0.05)


def test_identity_is_stable_and_distinct(fake_nvml):
    pynvml.nvmlInit()
    uuids = {pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(8)}
    assert len(uuids) == 8 and all(u.startswith("GPU-") for u in uuids)
    bus = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).busId
    assert bus == "00000000:18:00.0"


@pytest.mark.parametrize("after", [0.0, 60.0])
def test_checkpoints_begin_a_period_after_start_when_asked(clock, after):
    """`checkpoint_after_seconds`: no checkpoint begins that soon after start (a job
    saves after its first steps); the energy counter still integrates the power."""
    from tests.tools import scenario_from_yaml

    scenario = scenario_from_yaml(f"""
gpus: 2
workload: {{type: training, checkpoint_every_seconds: 30, checkpoint_seconds: 10,
           checkpoint_after_seconds: {after}}}
""")
    with fake.installed(scenario, clock, costs=None):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        start, t0 = _energy_joules(handle), clock.time()
        writing, instants = [], []
        for _ in range(1800):  # 90 s at 20 Hz
            clock.advance(0.05)
            util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            writing.append((clock.time() - t0, util == 0))
            instants.append(_instant_watts(handle))
        first = min(t for t, w in writing if w)
        assert after - 0.1 <= first < after + 30.1  # the first that may begin, begins
        mean_power = (_energy_joules(handle) - start) / 90.0
        assert mean_power == pytest.approx(np.mean(instants), rel=0.05)
