"""What the exporter holds stays what it needs: nothing made for a feature that is off,
nothing that grows with uptime."""

from __future__ import annotations

from exporter.gpu.backend import NvmlBackend
from exporter.sampling.clock import ManualClock
from exporter.sampling.sampler import Sampler, SamplerSettings
from exporter.sim import costs, fake
from exporter.sim.scenarios import load_scenario


def test_the_fake_without_costs_holds_no_burn_buffer():
    costs._zeros.cache_clear()
    clock = ManualClock()
    with fake.installed(load_scenario("training"), clock, costs=None):
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake"), clock=clock)
        sampler.start(threads=False)
        try:
            sampler.advance(5)
        finally:
            sampler.stop()
    assert costs._zeros.cache_info().currsize == 0
    costs.burn(0.0005)  # the costs on: the first burn makes it
    assert len(costs._zeros()) == costs._CHUNK_MAX
