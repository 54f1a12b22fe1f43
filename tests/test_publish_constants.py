"""What the analyses' thread reads every second but changes seldom is made once and kept
while it holds: the bindings' version, each loop's figures, the power limits, the
snapshot settled with the goodput account. The values are the ones made afresh."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import numpy as np
import pynvml
import pytest

from exporter.gpu.backend import NvmlBackend
from exporter.sampling.clock import ManualClock
from exporter.sampling.live_power import _row
from exporter.sampling.loops import Loop
from exporter.sampling.sampler import Sampler, SamplerSettings
from exporter.sim import fake
from exporter.sim.scenarios import load_scenario
from tests.tools import make_snapshot


@contextmanager
def simulated(seconds: float):
    clock = ManualClock()
    with fake.installed(load_scenario("training"), clock, costs=None):
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake"), clock=clock)
        sampler.start(threads=False)
        try:
            sampler.advance(seconds)
            yield sampler
        finally:
            sampler.stop()


class CountingBindings:
    """pynvml (which has no `__version__`), counting who asks for its version."""

    def __init__(self) -> None:
        self.asked = 0

    def __getattr__(self, name: str):
        if name == "__version__":
            self.asked += 1
            raise AttributeError(name)
        return getattr(pynvml, name)


def test_the_bindings_version_is_looked_up_once() -> None:
    nvml = CountingBindings()
    backend = NvmlBackend(nvml)  # type: ignore[arg-type]
    asked = nvml.asked
    assert backend.bindings_version == "unknown"
    assert backend.bindings_version == "unknown"
    assert nvml.asked == asked + 1
    versioned = CountingBindings()
    versioned.__version__ = "12.575.51"  # type: ignore[attr-defined]
    assert NvmlBackend(versioned).bindings_version == "12.575.51"  # type: ignore[arg-type]


def test_a_loops_figures_are_the_same_object_until_one_moves() -> None:
    clock = ManualClock()
    ticks = []
    loop = Loop("x", 5.0, lambda: ticks.append(1), stop=__import__("threading").Event(),
                clock=clock)
    first = loop.stats()
    assert loop.stats() is first
    loop.tick()
    second = loop.stats()
    assert second is not first and second.iterations_total == 1
    assert loop.stats() is second
    loop.enter(3)  # inside a GPU's call: the figures say so at once
    assert loop.stats().busy == "gpu 3"
    loop.leave()
    assert loop.stats().busy == ""
    clock.advance(5.0)
    loop.tick()
    third = loop.stats()
    assert third.iterations_total == 2 and third.target_hertz == pytest.approx(0.2)
    fresh = dataclasses.replace(third)  # the same figures made afresh
    assert fresh == third


def test_a_snapshot_with_another_goodput_is_the_replaced_one() -> None:
    snapshot = make_snapshot(2, readings={}, loops={"publish": None})
    account = object()
    got = snapshot.with_goodput(account)  # type: ignore[arg-type]
    want = dataclasses.replace(snapshot, goodput=account)
    assert got is not snapshot and got.goodput is account and snapshot.goodput is None
    for f in dataclasses.fields(want):
        assert getattr(got, f.name) == getattr(want, f.name), f.name
    with pytest.raises(TypeError):
        got.loops["publish"] = 1  # still read-only views  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.goodput = None  # type: ignore[misc]


def test_the_power_limits_are_made_again_only_when_an_identity_changes() -> None:
    with simulated(5.0) as sampler:
        analyses = sampler.analyses
        assert analyses is not None
        tdp = analyses._tdp()
        assert tdp is not None and analyses._tdp() is tdp
        assert not tdp.flags.writeable  # shared: nothing may write into it
        assert tdp.tolist() == [i.default_power_limit_watts for i in sampler.gpus.identities]
        ident = sampler.gpus.identities[0]
        sampler.gpus.identities[0] = dataclasses.replace(  # a GPU replaced in its slot
            ident, values={**ident.values, "default_power_limit_watts": 123.0})
        again = analyses._tdp()
        assert again is not tdp and again[0] == 123.0
        sampler.gpus.identities[1] = None  # lost: no limits for the node
        assert analyses._tdp() is None


@pytest.mark.parametrize("nan_column", [False, True])
def test_the_one_time_row_of_broadcast_times_is_their_nanmax(nan_column: bool) -> None:
    grid = np.arange(10.0) * 0.02 + 1.79e9
    if nan_column:
        grid[3] = np.nan
    times = np.broadcast_to(grid, (8, grid.size))
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning) if nan_column else \
            _nothing():
        want = np.nanmax(times, axis=0)
    got = _row(times)
    assert np.array_equal(got, want, equal_nan=True)
    got[0] = -1.0  # its own array: the grid is not changed through it
    assert grid[0] != -1.0
    ragged = np.vstack([grid, grid + 0.01])
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning) if nan_column else \
            _nothing():
        assert np.array_equal(_row(ragged), np.nanmax(ragged, axis=0), equal_nan=True)
    assert _row(np.zeros((3, 0))).size == 0


@contextmanager
def _nothing():
    yield
