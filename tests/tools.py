"""Helpers shared by tests."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporter.gpu.backend import NvmlBackend
from exporter.sampling.clock import ManualClock
from exporter.sampling.sampler import Sampler
from exporter.sim import fake
from exporter.sim.scenarios import Scenario, parse_scenario
from exporter.yamlfile import load_yaml

__all__ = ["ManualClock"]


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


def free_base_port(count: int) -> int:
    """A run of free ports below the kernel's ephemeral range (32768 up): Prometheus's own
    port and its scrapes' source ports, taken while the simulators start, come from there."""
    for _ in range(50):
        base = random.randrange(20000, 32768 - count)
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


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


def fresh_python(code: str, *args: str, timeout: float = 120) -> str:
    """Run `code` in a fresh interpreter from the repository root (nothing imported or
    allocated by the test run before it) and return its stdout; fails on a nonzero exit
    with the child's stderr."""
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                            text=True, timeout=timeout, cwd=REPO)
    assert result.returncode == 0, result.stderr
    return result.stdout


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


# -- running exporters ------------------------------------------------------------------

QUIET = {"collector_infiniband": False, "collector_host": False}


class ExporterFactory:
    """Starts real exporters on the fake and stops them all at the end.

    `start(manual=True)` samples only when the test calls `exporter.sampler.advance(s)`,
    on a manual clock (simulated time: no sleeping, no wall-clock luck); the HTTP
    server runs for real either way."""

    def __init__(self) -> None:
        self.exporters: list = []

    def start(self, manual: bool = False, fake_clock=None, collectors=None, limits=None,
              **config):
        from exporter.app import Exporter
        from exporter.config import Config
        from exporter.gpu.backend import private_nvml_module

        values = {"listen_address": "127.0.0.1:0", "fake": True, "fake_costs": False,
                  **QUIET, **config}
        clock = ManualClock() if manual else None
        # each exporter's own pynvml: a thread of another exporter still stopping can
        # never call into this one's fake (and, say, take its one-time hang)
        kwargs = {"nvml": private_nvml_module(f"test{len(self.exporters)}_{id(self)}")}
        if clock is not None:
            kwargs["clock"] = clock
        exporter = Exporter(Config.of(**values), collectors=collectors, fake_clock=fake_clock,
                            limits=limits, **kwargs)
        exporter.start(threads=not manual)
        self.exporters.append(exporter)
        return exporter

    def stop_all(self) -> None:
        for exporter in self.exporters:
            exporter.stop()
        self.exporters = []


def get_over_new_connection(port: int, context=None, headers: dict | None = None,
                            path: str = "/metrics") -> tuple[int, bytes]:
    """(status, body) of one GET on a new plain (context None) or TLS connection."""
    import http.client

    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=context)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def http_get(port: int, path: str = "/metrics", headers: dict | None = None,
             method: str = "GET", timeout: float = 5.0):
    """(response, body bytes) of one plain-HTTP request to a local exporter."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp, resp.read()
    finally:
        conn.close()


def families(text: str | bytes) -> dict:
    """Metric families of an exposition by name (counters without `_total`)."""
    from prometheus_client.parser import text_string_to_metric_families

    if isinstance(text, bytes):
        text = text.decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(text: str | bytes) -> dict[str, list]:
    """Samples of an exposition by sample name (counters with `_total`)."""
    out: dict[str, list] = {}
    for family in families(text).values():
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def assert_same_numbers(got, want, rel: float = 1e-9, abs_tol: float = 1e-12,
                        where: str = "") -> None:
    """got == want, except that floats (and float arrays) need agree only to `rel`: the
    last digits of numpy's results depend on the CPU (OpenBLAS kernels, SIMD paths of
    exp and log), so two code paths that agree on one machine may not on another.
    Dataclasses, mappings and sequences are compared member by member."""
    import dataclasses
    import math

    import numpy as np

    if dataclasses.is_dataclass(got) and not isinstance(got, type):
        assert type(got) is type(want), f"{where}: {type(got)} != {type(want)}"
        for field in dataclasses.fields(got):
            assert_same_numbers(getattr(got, field.name), getattr(want, field.name), rel,
                                abs_tol, f"{where}.{field.name}")
    elif isinstance(got, dict):
        assert isinstance(want, dict) and got.keys() == want.keys(), f"{where}: keys differ"
        for key in got:
            assert_same_numbers(got[key], want[key], rel, abs_tol, f"{where}[{key!r}]")
    elif isinstance(got, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), f"{where}: {got} != {want}"
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_same_numbers(a, b, rel, abs_tol, f"{where}[{i}]")
    elif isinstance(got, np.ndarray):
        assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
        assert np.allclose(got, want, rtol=rel, atol=abs_tol, equal_nan=True), where
    elif isinstance(got, float) and not isinstance(want, bool) and isinstance(want, float):
        same = (math.isnan(got) and math.isnan(want)) or math.isclose(
            got, want, rel_tol=rel, abs_tol=abs_tol)
        assert same, f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def make_snapshot(gpus: int = 2, **fields):
    """A minimal Snapshot of `gpus` identified GPUs; `fields` override (for renderers)."""
    from exporter.gpu.reading import GpuIdentity
    from exporter.sampling.snapshot import Snapshot

    identities = tuple(GpuIdentity(i, f"GPU-{i:08d}", "NVIDIA H100", f"0000:{i:02x}:00.0", "")
                       for i in range(gpus))
    values = {"time": 1.0, "started_at": 0.0, "backend": "fake", "scenario": "test",
              "driver_version": "1", "nvml_version": "1", "bindings_version": "1",
              "gpu_count": gpus, "expected_gpus": gpus, "identities": identities,
              "readings": {}, "power": {}, "power_sampling": {}, "loops": {},
              "nvml_errors": {}, **fields}
    return Snapshot(**values)


def not_judged(snapshot):
    """The snapshot published with an explicit `unknown` verdict (nothing judged it)."""
    from exporter.health.monitor import Published

    return Published.not_judged(snapshot)


def judged(snapshot, monitor=None):
    """The snapshot published with its verdict, as the app publishes it."""
    from exporter.health.monitor import HealthMonitor, Published

    return Published(snapshot, (monitor or HealthMonitor()).assess(snapshot))


def xid_sources(history, snapshot, kmsg_path: str = "", boot_time=lambda: 0.0):
    """The sampler's XID side for `snapshot`'s GPUs, begun with what `history` hands over
    as the exporter begins it: (the ledger, the kernel log's follower, None without
    `kmsg_path`)."""
    import threading
    from types import SimpleNamespace

    from exporter.sampling.clock import SYSTEM
    from exporter.sampling.xid_sources import XidSources

    sources = XidSources(SimpleNamespace(identities=snapshot.identities), SYSTEM,
                         threading.Event(), kmsg_path)
    if sources.kernel_log is not None:
        sources.kernel_log.boot_time = boot_time
    sources.begin(history.begin(snapshot.identities, snapshot.driver_version), history)
    return sources.ledger, sources.kernel_log


def wake_ups(tid: int, pid: int | str = "self") -> int:
    """A live thread's voluntary context switches so far: its wake-ups (Linux). `tid`:
    its native id (threading.Thread.native_id; a process's main thread: its pid)."""
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def simulated_snapshot(scenario: Scenario, seconds: float, settings, prepare=None):
    """The snapshot after `seconds` of simulated time on the fake `scenario` (a Sampler
    with `settings`, ticked by hand; `prepare(sampler)` runs before it starts)."""
    clock = ManualClock()
    with fake.installed(scenario, clock, costs=None):
        sampler = Sampler(NvmlBackend(), settings, clock=clock)
        if prepare is not None:
            prepare(sampler)
        sampler.start(threads=False)
        try:
            sampler.advance(seconds)
            return sampler.build_snapshot()
        finally:
            sampler.stop()
