"""Fixtures shared by the tests: a manual clock, the fake under pynvml, and running
exporters (on the fake, with the fake's costs off unless a test asks for them)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from exporter.sampling.clock import ManualClock
from exporter.sim import fake
from exporter.sim.scenarios import Scenario, load_scenario
from tests.tools import ExporterFactory


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: starts real Prometheus/node_exporter processes "
                            "and runs for tens of seconds (deselect with -m 'not e2e')")
    config.addinivalue_line("markers", "image: builds the container image and runs the exporter "
                            "in it (debootstrap, buildah; deselect with -m 'not image')")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per CPU, at most 4. Many tests run real servers and subprocess
    exporters whose latency they bound; more workers than CPUs would starve them."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def training() -> Scenario:
    return load_scenario("training")


@pytest.fixture
def fake_nvml(training: Scenario, clock: ManualClock) -> Iterator[fake.FakeNvmlLibrary]:
    """The training scenario under pynvml, on a manual clock, without call costs."""
    with fake.installed(training, clock, costs=None) as lib:
        yield lib


@pytest.fixture
def running_exporter() -> Iterator[ExporterFactory]:
    """Starts exporters on the fake (see tools.ExporterFactory); stops them all after."""
    factory = ExporterFactory()
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture(scope="module")
def module_exporter() -> Iterator[ExporterFactory]:
    factory = ExporterFactory()
    try:
        yield factory
    finally:
        factory.stop_all()
