"""The sweep's cadences on the fake, in simulated time: the cheap values every second, the
slow sweep (ECC, row remapping, NVLink, PCIe counters) every --sweep.health-interval,
15 s by default, with no read left out and none made twice."""

from __future__ import annotations

import pytest

from exporter.sampling.settings import SamplerSettings


def read_times(factory, interval: float | None, seconds: int
               ) -> tuple[list[float], list[float], dict]:
    """(when GPU 0's device read (the slow sweep's) changed, when its sweep reading changed,
    the NVML calls made over the run), second by second after the start."""
    config = {} if interval is None else {"gpu_health_interval_seconds": interval}
    exporter = factory.start(manual=True, scenario="training", **config)
    sampler, start = exporter.sampler, exporter.sampler.clock.time()
    calls0 = dict(exporter.fake_lib.calls)
    slow, sweeps = [], []
    for _ in range(seconds):
        sampler.advance(1.0)
        device, reading = sampler.sweep.device_reads[0], sampler.sweep.readings[0]
        if not slow or device.time - start != slow[-1]:
            slow.append(device.time - start)
        if not sweeps or reading.time - start != sweeps[-1]:
            sweeps.append(reading.time - start)
    calls = {k: v - calls0.get(k, 0) for k, v in exporter.fake_lib.calls.items()}
    return slow, sweeps, calls


def test_the_default_health_interval_is_a_scrape_interval():
    assert SamplerSettings().gpu_health_interval_seconds == 15.0


@pytest.mark.parametrize("interval", [None, 5.0])
def test_the_slow_sweep_comes_every_interval_and_the_sweep_every_second(running_exporter,
                                                                       interval):
    every = interval or 15.0
    slow, sweeps, calls = read_times(running_exporter, interval, 61)
    gaps = [b - a for a, b in zip(slow, slow[1:], strict=False)]
    assert gaps and all(gap == pytest.approx(every) for gap in gaps), slow
    assert [b - a for a, b in zip(sweeps, sweeps[1:], strict=False)] == pytest.approx(
        [1.0] * (len(sweeps) - 1))
    # data CRC of links 12-17 is one call a link per slow sweep: 6 a GPU, 8 GPUs
    assert calls["nvmlDeviceGetNvLinkErrorCounter"] == 6 * 8 * (len(slow) - 1)
    assert calls["nvmlDeviceGetTemperature"] == 8 * 61  # every GPU every second
