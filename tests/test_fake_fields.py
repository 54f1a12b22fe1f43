"""The fake's field answers it keeps (those no time or fault can change) are the ones it
would work out afresh, in every built-in scenario and at any time."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.gpu import fields as fi
from exporter.gpu.backend import field_name
from exporter.gpu.device_read import device_read_requests
from exporter.sampling.clock import ManualClock
from exporter.sim import fake
from exporter.sim.fake_fields import _CHANGES
from exporter.sim.scenarios import load_scenario

SCENARIOS = sorted(p.stem for p in (Path(fake.__file__).parents[1] / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("name", SCENARIOS)
def test_kept_answers_are_what_the_fake_works_out_afresh(name):
    scenario = load_scenario(name)
    clock = ManualClock()
    lib = fake.FakeNvmlLibrary(scenario, clock, costs=None)
    lib.initialized = 1
    asked = tuple((fid, scope) for fid, scope in (
        (r, 0) if isinstance(r, int) else r
        for r in [*device_read_requests(scenario.device.nvlinks), fi.POWER_INSTANT]))
    kept_some = False
    for t in (0.0, 7.0, 30.0, 95.0, 400.0, 1300.0):  # before, during and after the faults
        clock.advance(t - (clock.time() - lib.start))
        for gpu in lib.gpus:
            now = lib.now()
            kept = lib._fixed_answers(gpu, asked, now)
            for (field_id, scope), answer in zip(asked, kept, strict=True):
                if answer is not _CHANGES:
                    kept_some = True
                    assert answer == lib._field(gpu, field_id, scope, now), (
                        name, t, gpu.index, field_name(field_id), scope)
    assert kept_some
