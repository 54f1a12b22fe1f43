"""The sweep's cadences on the fake, in simulated time: the cheap values every second, the
health reads (ECC, row remapping, NVLink, PCIe counters) every --sweep.health-interval,
15 s by default, with no read left out and none made twice."""

from __future__ import annotations

import pytest

from exporter.sampling.settings import SamplerSettings
from tests.tools import ExporterFactory


def read_times(interval: float | None, seconds: int) -> tuple[list[float], list[float], dict]:
    """(when GPU 0's device read changed, when its sweep reading changed, NVML calls made
    over the run), second by second after the start."""
    factory = ExporterFactory()
    config = {} if interval is None else {"gpu_health_interval_seconds": interval}
    try:
        exporter = factory.start(manual=True, scenario="training", **config)
        sampler, start = exporter.sampler, exporter.sampler.clock.time()
        calls0 = dict(exporter.fake_lib.calls)
        health, sweeps = [], []
        for _ in range(seconds):
            sampler.advance(1.0)
            device, reading = sampler.sweep.device_reads[0], sampler.sweep.readings[0]
            if not health or device.time - start != health[-1]:
                health.append(device.time - start)
            if not sweeps or reading.time - start != sweeps[-1]:
                sweeps.append(reading.time - start)
        calls = {k: v - calls0.get(k, 0) for k, v in exporter.fake_lib.calls.items()}
        return health, sweeps, calls
    finally:
        factory.stop_all()


def test_the_default_health_interval_is_a_scrape_interval():
    assert SamplerSettings().gpu_health_interval_seconds == 15.0


@pytest.mark.parametrize("interval", [None, 5.0])
def test_health_reads_come_every_interval_and_the_sweep_every_second(interval):
    every = interval or 15.0
    health, sweeps, calls = read_times(interval, 61)
    gaps = [b - a for a, b in zip(health, health[1:], strict=False)]
    assert gaps and all(gap == pytest.approx(every) for gap in gaps), health
    assert [b - a for a, b in zip(sweeps, sweeps[1:], strict=False)] == pytest.approx(
        [1.0] * (len(sweeps) - 1))
    # data CRC of links 12-17 is one call a link per health read: 6 a GPU, 8 GPUs
    assert calls["nvmlDeviceGetNvLinkErrorCounter"] == 6 * 8 * (len(health) - 1)
    assert calls["nvmlDeviceGetTemperature"] == 8 * 61  # every GPU every second
