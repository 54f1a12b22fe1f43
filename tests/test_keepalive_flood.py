"""A flood of idle keep-alive connections must not cost fresh scrapes.

Each flood connection sends one request to /healthz, gets its answer and then holds the
connection idle, as a misbehaving client or a connection-pool leak does. At the cap, the
server must evict those idle connections, never a scraper's connection that is still
sending its request. Loopback only; every loop is bounded in count and time.
"""

from __future__ import annotations

import collections
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.app import Exporter
from exporter.config import Config
from exporter.web.server import ServerLimits
from tests.certs import make_certs
from tests.tools import get_over_new_connection, wait_for

LIMITS = ServerLimits(max_connections=48, max_active_requests=4, head_timeout_seconds=2.0,
                      idle_timeout_seconds=30.0, io_timeout_seconds=2.0)
RATE = 200  # flood connections per second
SECONDS = 3.5  # at least: 700 connections, the 48-connection cap reached over and over
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


class IdleFlood:
    """Opens RATE connections a second, each sends one request and then stays idle.

    The client keeps its newest 400 sockets open (far more than the server's cap), so
    the server is full of idle connections for the whole run."""

    def __init__(self, port: int, context: ssl.SSLContext | None = None):
        self.port, self.context = port, context
        self.opened = 0
        self.done = threading.Event()  # set when the scrapes are over
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> IdleFlood:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join(10)

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=2)
        if self.context is not None:
            sock = self.context.wrap_socket(sock, server_hostname="127.0.0.1")
        sock.sendall(HEALTHZ)
        return sock

    def _run(self) -> None:
        held: collections.deque[socket.socket] = collections.deque()
        start = time.monotonic()
        for i in range(RATE * 40):  # bounded: 40 s of connections at most
            if self.done.is_set():
                break
            due = start + i / RATE
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            try:
                held.append(self._connect())
                self.opened += 1
            except OSError:
                pass  # evicted during the handshake: the flood just goes on
            while len(held) > 400:
                held.popleft().close()
        for sock in held:
            sock.close()


def fresh_scrapes(port: int, context: ssl.SSLContext | None, going: Callable[[list], bool],
                  headers: dict | None = None) -> list[int | str]:
    """One new connection per scrape, every 40 ms, while `going(results so far)` (at most
    30 s): status codes (or the error's name)."""
    results: list[int | str] = []
    deadline = time.monotonic() + 30
    while going(results) and time.monotonic() < deadline:  # at most 750 scrapes
        try:
            status, body = get_over_new_connection(port, context, headers)
            results.append(status if b"gpu_power_watts" in body else "short")
        except (OSError, http.client.HTTPException) as exc:
            results.append(type(exc).__name__)
        time.sleep(0.04)
    return results


def evictions(exp: Exporter) -> dict[str, float]:
    body = exp.current.body.decode()
    for family in text_string_to_metric_families(body):
        if family.name == "cte_http_connection_evictions":
            return {s.labels["state"]: s.value for s in family.samples}
    return {}


def run_flood(exp: Exporter, context: ssl.SSLContext | None) -> tuple[list, IdleFlood]:
    with IdleFlood(exp.port, context) as flood:
        time.sleep(0.5)  # let the flood fill the server first
        # 3 s and at least 20 scrapes (on a loaded machine, scrapes are slower)
        end = time.monotonic() + SECONDS - 0.5
        results = fresh_scrapes(exp.port, context,
                                lambda done: time.monotonic() < end or len(done) < 20)
    return results, flood


def assert_scrapes_survived(results: list, flood: IdleFlood, exp: Exporter) -> None:
    ok = results.count(200)
    assert len(results) >= 20, results
    assert ok >= 0.99 * len(results), f"{len(results) - ok} of {len(results)} failed: " + str(
        [r for r in results if r != 200])
    assert flood.opened > 2 * LIMITS.max_connections  # the cap was really reached
    evicted = exp.server.connections.evicted_by_state
    # idle ones go first; a head is evicted only at a moment when none was idle
    assert evicted["idle"] > 0 and evicted["head"] <= 0.05 * evicted["idle"], evicted


def test_idle_keepalive_flood_leaves_fresh_scrapes_alone():
    exp = Exporter(Config.of(listen_address="127.0.0.1:0", fake=True, collector_host=False,
                          collector_infiniband=False), limits=LIMITS)
    exp.start()
    try:
        results, flood = run_flood(exp, None)
        assert_scrapes_survived(results, flood, exp)
        # as exported: the next snapshot carries the server's counters
        counted = wait_for(lambda: (c := evictions(exp)).get("idle", 0) > 0 and c, timeout=5)
        assert counted.get("idle", 0) > 0 and "head" in counted, counted
    finally:
        exp.stop()


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_idle_keepalive_flood_over_tls_leaves_fresh_scrapes_alone(certs, tmp_path):
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {certs.server_cert}\n"
                   f"  key_file: {certs.server_key}\n")
    exp = Exporter(Config.of(listen_address="127.0.0.1:0", fake=True, collector_host=False,
                          collector_infiniband=False, web_config_file=str(web)), limits=LIMITS)
    exp.start()
    context = ssl.create_default_context(cafile=str(certs.ca))
    try:
        results, flood = run_flood(exp, context)
        assert_scrapes_survived(results, flood, exp)
    finally:
        exp.stop()
