"""Helpers shared by tests."""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from exporter.sim.scenarios import Scenario, parse_scenario
from exporter.yamlfile import load_yaml


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("CTE_REQUIRE_TOOLS") == "1":
        pytest.fail(f"{name} is required (install the Debian package)")
    pytest.skip(f"{name} not installed")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ManualClock:
    """A clock tests move by hand, so the fake's physics are deterministic."""

    def __init__(self, start: float = 1_790_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def scenario_from_yaml(text: str, name: str = "test") -> Scenario:
    return parse_scenario(load_yaml(text, name), name, name)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05):
    """Poll predicate until it returns a truthy value; fail the test on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"condition not met within {timeout} s")


REPO = Path(__file__).resolve().parent.parent


def require_module(name: str):
    """Import a module the tests need; skip without it (fail under CTE_REQUIRE_TOOLS=1)."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        if os.environ.get("CTE_REQUIRE_TOOLS") == "1":
            pytest.fail(f"Python package {name} is required (pip install -e '.[test]')")
        pytest.skip(f"Python package {name} not installed")


def stop_process(proc) -> None:
    """Terminate a test's child process, killing it if it does not go."""
    import subprocess

    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# The recorded 8x H100 nvidia-smi log in shared/data, beside the checkout (as in CI) or in
# this workspace; tests that read it skip where neither exists.
_TRACE = "data/h100x8-nanogpt-training.nvidia-smi.csv"
_SHARED = (REPO.parent / "shared", Path("/work/shared"))
REAL_TRACE = next((s / _TRACE for s in _SHARED if (s / _TRACE).exists()), _SHARED[0] / _TRACE)
