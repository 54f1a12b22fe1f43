from __future__ import annotations

from collections.abc import Iterator

import pytest

from exporter.sim import fake
from exporter.sim.scenarios import Scenario, load_scenario
from tests.tools import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def training() -> Scenario:
    return load_scenario("training")


@pytest.fixture
def fake_nvml(training: Scenario, clock: ManualClock) -> Iterator[fake.FakeNvmlLibrary]:
    """The training scenario under pynvml, on a manual clock."""
    with fake.installed(training, clock) as lib:
        yield lib
