"""What the bench scripts share: starting the measured targets and scraping them the
way Prometheus does (run the scripts as `python bench/NAME.py`; this is imported by name).
"""

from __future__ import annotations

import http.client
import shutil
import socket
import subprocess
import threading
import time
from typing import Any

# What Prometheus sends: gzip, and the formats it accepts in its order of preference.
HEADERS = {"Accept-Encoding": "gzip",
           "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;q=0.4"}

# node_exporter as the scrape-latency reference: a minimal collector set, so it answers
# from /proc quickly and its figure is the floor of an exporter's HTTP round trip.
NODE_EXPORTER_MINIMAL = ("--collector.disable-defaults", "--collector.cpu",
                         "--collector.meminfo")


def manual_fake_exporter(scenario: str = "training") -> Any:
    """One exporter as `run --fake --no-fake.costs` builds it, started on a manual clock with
    its threads off: the caller moves simulated time with `exporter.sampler.advance`."""
    from exporter.app import Exporter
    from exporter.config import Config
    from exporter.sampling.clock import ManualClock

    exporter = Exporter(Config.of(listen_address="127.0.0.1:0", fake=True, fake_costs=False,
                                  scenario=scenario), clock=ManualClock())
    exporter.start(threads=False)
    return exporter


def free_port() -> int:
    """A loopback port free now (the target binds it a moment later: a small race)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int, conn: http.client.HTTPConnection | None = None) -> tuple[float, int]:
    """One GET /metrics as Prometheus sends it: (seconds, body bytes). A fresh connection
    unless `conn` is given (Prometheus keeps its connection alive between scrapes, but at
    15 s intervals both are the same cost)."""
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        t0 = time.perf_counter()
        conn.request("GET", "/metrics", headers=HEADERS)
        resp = conn.getresponse()
        body = resp.read()
        elapsed = time.perf_counter() - t0
        if resp.status != 200:
            raise OSError(f"GET /metrics on {port}: HTTP {resp.status}")
        return elapsed, len(body)
    finally:
        if own:
            conn.close()


class TargetDown(RuntimeError):
    """A target never answered, or exited."""


def wait_http(port: int, seconds: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Until GET /metrics answers 200; TargetDown if it never does (or `proc` dies)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise TargetDown(f"the target on port {port} exited with {proc.returncode}")
        try:
            scrape(port)
            return
        except OSError:
            time.sleep(0.1)
    raise TargetDown(f"nothing answered GET /metrics on port {port} within {seconds:.0f} s")


def node_exporter_binary() -> str | None:
    """Debian's prometheus-node-exporter, or an upstream node_exporter on PATH."""
    return shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


def start_node_exporter(port: int, collectors: tuple[str, ...] = NODE_EXPORTER_MINIMAL
                        ) -> subprocess.Popen:
    binary = node_exporter_binary()
    if binary is None:
        raise FileNotFoundError("node_exporter is not installed "
                                "(apt-get install prometheus-node-exporter)")
    return subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}", *collectors],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class PrometheusPair(threading.Thread):
    """Two scrapers (an HA pair of Prometheus servers), each every `interval` seconds, the
    second half an interval after the first: two servers are not synchronised, and this
    phase makes every scrape land on a different snapshot (no scrape reuses another's
    rendering: the worst case for an exporter that renders once per snapshot).

    Runs in the measured process, so it counts the CPU its own thread spends
    (`cpu_seconds`) for the caller to take off the process's figure."""

    def __init__(self, port: int, interval: float = 15.0):
        super().__init__(name="bench-scraper", daemon=True)
        self.port, self.interval = port, interval
        self.latencies: list[float] = []
        self.bytes = 0
        self.errors = 0
        self.cpu_seconds = 0.0
        self._done = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        due = [start, start + self.interval / 2]
        while True:
            i = 0 if due[0] <= due[1] else 1
            if self._done.wait(max(0.0, due[i] - time.monotonic())):
                return
            c0 = time.thread_time()
            try:
                elapsed, size = scrape(self.port)
                self.latencies.append(elapsed)
                self.bytes = size
            except OSError:
                self.errors += 1
            self.cpu_seconds += time.thread_time() - c0
            due[i] += self.interval

    def stop(self) -> None:
        self._done.set()
        self.join(5)
