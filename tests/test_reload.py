"""SIGHUP reloads the config and web config files, all or nothing.

End to end: a real `run` process is scraped over TLS without a break while its
certificate and a password are rotated and a broken web config is refused. In process:
what a reload applies, keeps and names. Loopback only; loops bounded in count and time.
"""

from __future__ import annotations

import base64
import http.client
import logging
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.app import Exporter
from exporter.config import Config
from exporter.service import reload
from tests.certs import make_certs, server_cert
from tests.tools import free_port, http_get, require_module, stop_process, wait_for

SCRAPER, ROTATED = ("scraper", "s3cret"), ("rotated", "old-password")
NEW_PASSWORD = "new-password"


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # as a config management tool does: no half-written file


def web_yaml(cert: Path, key: Path, users: dict[str, str]) -> str:
    bcrypt = require_module("bcrypt")
    lines = [f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\nbasic_auth_users:"]
    for user, password in users.items():
        lines.append(f"  {user}: '{bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()}'")
    return "\n".join(lines) + "\n"


class Scraper:
    """Scrapes /metrics every 50 ms on a fresh TLS connection; records status and the
    serial number of the certificate the server presented."""

    def __init__(self, port: int, context: ssl.SSLContext):
        self.port, self.context = port, context
        self.results: list[tuple[int | str, str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def get(self, path: str, user: tuple[str, str]) -> tuple[int | str, str, bytes]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=5,
                                           context=self.context)
        try:
            conn.request("GET", path, headers=basic(*user))
            resp = conn.getresponse()
            body = resp.read()
            serial = conn.sock.getpeercert()["serialNumber"] if conn.sock else ""
            return resp.status, serial, body
        except (OSError, http.client.HTTPException) as exc:
            return type(exc).__name__, "", b""
        finally:
            conn.close()

    def _run(self) -> None:
        deadline = time.monotonic() + 60
        while not self.stop.is_set() and time.monotonic() < deadline:  # at most 1,200
            status, serial, _ = self.get("/metrics", SCRAPER)
            self.results.append((status, serial))
            self.stop.wait(0.05)

    def serials_since(self, start: int) -> set[str]:
        return {serial for _, serial in self.results[start:]}


def metric(body: bytes, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise KeyError(name)


def test_sighup_rotates_certificate_and_password_without_a_failed_scrape(tmp_path):
    certs = make_certs(tmp_path / "certs")
    new_cert, new_key = server_cert(certs, "server2")
    web = tmp_path / "web.yml"
    web.write_text(web_yaml(certs.server_cert, certs.server_key, dict([SCRAPER, ROTATED])))
    port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(f"listen_address: 127.0.0.1:{port}\nfake: true\nweb_config_file: {web}\n"
                      "collector_host: false\ncollector_infiniband: false\n")
    log = tmp_path / "exporter.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", "--config", str(config)],
                                stdout=out, stderr=subprocess.STDOUT)
    context = ssl.create_default_context(cafile=str(certs.ca))
    scraper = Scraper(port, context)
    try:
        wait_for(lambda: scraper.get("/healthz", SCRAPER)[0] == 200 or proc.poll() is not None,
                 timeout=30)
        assert proc.poll() is None, log.read_text()
        old_serial = scraper.get("/metrics", SCRAPER)[1]
        scraper.thread.start()
        wait_for(lambda: len(scraper.results) >= 5, timeout=30)  # scrapes before the rotation

        # 1. rotate: a renewed certificate and a new password for one user
        write_atomically(web, web_yaml(new_cert, new_key,
                                       {SCRAPER[0]: SCRAPER[1], ROTATED[0]: NEW_PASSWORD}))
        mark = len(scraper.results)
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: scraper.serials_since(mark) - {old_serial, ""}, timeout=30)
        new_serial = next(iter(scraper.serials_since(mark) - {old_serial, ""}))
        assert scraper.get("/metrics", (ROTATED[0], NEW_PASSWORD))[0] == 200
        assert scraper.get("/metrics", ROTATED)[0] == 401

        # 2. a broken file (certificate and key that do not match) is refused; all stays
        write_atomically(web, web_yaml(certs.server_cert, new_key, {"nobody": "x"}))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload refused" in log.read_text(), timeout=30)
        time.sleep(0.5)
        assert proc.poll() is None
        status, serial, body = scraper.get("/metrics", (ROTATED[0], NEW_PASSWORD))
        assert (status, serial) == (200, new_serial)

        def counted() -> bytes | None:  # once a snapshot carries the refused reload
            body = scraper.get("/metrics", SCRAPER)[2]
            try:
                return body if metric(body, "cte_config_reloads_total", result="failure") else None
            except KeyError:
                return None

        body = wait_for(counted, timeout=30)
        assert metric(body, "cte_config_reloads_total", result="success") == 1
        assert metric(body, "cte_config_reloads_total", result="failure") == 1
        assert metric(body, "cte_config_last_reload_successful") == 0
        wait_for(lambda: len(scraper.results) >= 20, timeout=30)  # asserted below
    finally:
        scraper.stop.set()
        if scraper.thread.is_alive():
            scraper.thread.join(10)
        alive = proc.poll() is None
        stop_process(proc)
    text = log.read_text()
    assert alive, text
    assert proc.returncode == 0, text
    statuses = [status for status, _ in scraper.results]
    assert len(statuses) >= 20 and set(statuses) == {200}, statuses
    refused = [line for line in text.splitlines() if "reload refused" in line]
    assert len(refused) == 1 and "key_file" in refused[0], refused


def _tgkill(pid: int, tid: int, sig: int) -> None:
    """Send a signal to one thread of another process (as the kernel may pick any)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "tgkill"):
        pytest.skip("this C library has no tgkill()")
    if libc.tgkill(pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def test_signals_delivered_to_any_thread_are_handled(tmp_path):
    """The kernel delivers a process's signal to any thread that does not block it. Python
    runs the handler in the main thread, which must not sleep through it: a SIGHUP sent
    to a sampling thread reloads, a SIGTERM sent to one stops the exporter."""
    port = free_port()
    log = tmp_path / "exporter.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "run", "--fake", "--no-collector.host",
             "--no-collector.infiniband", "--web.listen-address", f"127.0.0.1:{port}"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "serving on" in log.read_text() or proc.poll() is not None, 30)
        assert proc.poll() is None, log.read_text()
        threads = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task"))
        others = [t for t in threads if t != proc.pid]
        assert others  # the sampling threads
        _tgkill(proc.pid, others[0], signal.SIGHUP)
        wait_for(lambda: "reloaded" in log.read_text(), timeout=10)
        _tgkill(proc.pid, others[-1], signal.SIGTERM)
        assert proc.wait(10) == 0, log.read_text()
    finally:
        stop_process(proc)


@pytest.fixture
def exporter():
    exp = Exporter(Config.of(listen_address="127.0.0.1:0", fake=True, collector_host=False,
                          collector_infiniband=False, log_level="info"))
    exp.start()
    try:
        yield exp
    finally:
        exp.stop()
        logging.getLogger().setLevel(logging.WARNING)


def test_reload_applies_log_level_and_names_keys_that_need_a_restart(exporter, tmp_path,
                                                                     caplog):
    config = tmp_path / "config.yaml"
    config.write_text("listen_address: 127.0.0.1:0\nfake: true\npower_sample_rate_hz: 50\n"
                      "collector_host: false\ncollector_infiniband: false\nlog_level: debug\n")
    with caplog.at_level(logging.INFO):
        assert reload(exporter, str(config), {})
        assert logging.getLogger().level == logging.DEBUG
    assert exporter.config.log.log_level == "debug"
    assert exporter.config.sampler.power_sample_rate_hz == 20  # not applied live ...
    restart = [r.getMessage() for r in caplog.records if "need" in r.getMessage()]
    assert len(restart) == 1 and "power_sample_rate_hz" in restart[0]  # ... but named


def test_a_bad_config_file_is_refused_and_the_running_one_kept(exporter, tmp_path, caplog):
    config = tmp_path / "config.yaml"
    config.write_text("power_sample_rate_hz: 5000\n")
    before = exporter.config
    with caplog.at_level(logging.ERROR):
        assert not reload(exporter, str(config), {})
    assert exporter.config is before
    (line,) = [r.getMessage() for r in caplog.records if "reload refused" in r.getMessage()]
    assert "power_sample_rate_hz" in line and "\n" not in line
    assert exporter.reloads.stats().failures_total == 1


def test_a_fifo_behind_a_reload_is_refused_and_later_reloads_still_apply(tmp_path):
    """A config file swapped for a named pipe blocked the reload forever, and with it
    every later one: it is refused at once, and the next good file reloads."""
    port = free_port()
    config = tmp_path / "config.yaml"
    good = ("fake: true\ncollector_host: false\ncollector_infiniband: false\n"
            f"listen_address: 127.0.0.1:{port}\n")
    config.write_text(good + "log_level: info\n")
    log = tmp_path / "exporter.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", "--config",
                                 str(config)], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "serving on" in log.read_text() or proc.poll() is not None, 30)
        assert proc.poll() is None, log.read_text()
        config.unlink()
        os.mkfifo(config)
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload refused" in log.read_text(), timeout=30)
        refused = [line for line in log.read_text().splitlines() if "reload refused" in line]
        assert len(refused) == 1 and "named pipe (FIFO), not a regular file" in refused[0]
        config.unlink()
        write_atomically(config, good + "log_level: debug\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "log level debug" in log.read_text(), timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        stop_process(proc)


def test_a_reload_to_a_profile_that_needs_a_collector_starts_it(tmp_path, caplog):
    """minimal leaves the host collector out (none of its families is served); a reload
    to standard must serve host_* again, not leave them missing without a word."""
    keys = "listen_address: 127.0.0.1:0\nfake: true\nfake_costs: false\n" \
           "collector_infiniband: false\nlog_level: info\n"
    exp = Exporter(Config.of(listen_address="127.0.0.1:0", fake=True, fake_costs=False,
                             collector_infiniband=False, log_level="info",
                             metrics_profile="minimal"))
    exp.start()
    config = tmp_path / "config.yaml"

    def host_families() -> set[str]:
        body = http_get(exp.port)[1].decode()
        return {f.name for f in text_string_to_metric_families(body)
                if f.name.startswith("host_")}

    try:
        assert host_families() == set()
        running = [r.name for r in exp.sampler.collectors]
        assert "host" not in running
        config.write_text(keys + "metrics_profile: standard\n")
        with caplog.at_level(logging.INFO):
            assert reload(exp, str(config), {})
        started = [r.getMessage() for r in caplog.records if "started" in r.getMessage()]
        assert len(started) == 1 and "host" in started[0], started
        assert not [r for r in caplog.records if "restart" in r.getMessage()]
        wait_for(host_families, timeout=15)
        assert {"host_cpus", "host_memory_available_bytes"} <= host_families()
        # back to minimal: not served; to standard again: the same collector, not a second
        config.write_text(keys + "metrics_profile: minimal\n")
        assert reload(exp, str(config), {})
        wait_for(lambda: not host_families(), timeout=15)
        config.write_text(keys + "metrics_profile: standard\n")
        assert reload(exp, str(config), {})
        assert [r.name for r in exp.sampler.collectors] == [*running, "host"]
        wait_for(host_families, timeout=15)
    finally:
        exp.stop()
        logging.getLogger().setLevel(logging.WARNING)
