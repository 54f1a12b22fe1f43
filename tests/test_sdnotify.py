"""systemd notify protocol: READY, WATCHDOG only while alive, RELOADING, STOPPING."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import types

import pytest

from exporter import sdnotify
from exporter.service import serve
from tests.tools import free_port, stop_process, wait_for, wake_ups


class NotifySocket:
    """A fake $NOTIFY_SOCKET: a datagram socket that collects what is sent to it."""

    def __init__(self, address: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(0.1)
        self.messages: list[str] = []

    def drain(self, until: str | None = None, timeout: float = 10.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                if until is None:
                    break
            if until is not None and any(m.startswith(until) for m in self.messages):
                break
        return self.messages

    def pending(self) -> list[str]:
        """What has arrived so far, without waiting for more (all messages kept)."""
        self.sock.setblocking(False)
        try:
            while True:
                self.messages.append(self.sock.recv(4096).decode())
        except BlockingIOError:
            pass
        finally:
            self.sock.settimeout(0.1)
        return self.messages

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path, monkeypatch):
    path = str(tmp_path / "notify")
    fake = NotifySocket(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    yield fake
    fake.close()


def test_notify_without_systemd_does_nothing(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.notify("READY=1") is False


def test_notify_sends_one_datagram(notify_socket):
    assert sdnotify.notify("READY=1")
    assert sdnotify.reloading()
    messages = notify_socket.drain()
    assert messages[0] == "READY=1"
    assert messages[1].startswith("RELOADING=1\nMONOTONIC_USEC=")


def test_abstract_notify_socket(monkeypatch):
    name = f"cte-test-{time.monotonic_ns()}"
    fake = NotifySocket("\0" + name)
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    try:
        assert sdnotify.notify("WATCHDOG=1")
        assert fake.drain() == ["WATCHDOG=1"]
    finally:
        fake.close()


def test_watchdog_interval(monkeypatch):
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert sdnotify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert sdnotify.watchdog_interval() == 1.0
    monkeypatch.setenv("WATCHDOG_PID", "1")  # another process's watchdog
    assert sdnotify.watchdog_interval() is None


def test_watchdog_pings_only_while_the_exporter_is_alive(notify_socket, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # a ping every 50 ms
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    health = {"alive": True, "dead_checks": 0}

    def alive() -> bool:
        if not health["alive"]:
            health["dead_checks"] += 1
        return health["alive"]

    exporter = types.SimpleNamespace(alive=alive)
    wake = threading.Event()
    signals = types.SimpleNamespace(stop=False, reload=False,
                                    wait=lambda timeout: wake.wait(timeout) and wake.clear())
    thread = threading.Thread(target=serve, args=(exporter, signals, None, {}), daemon=True)
    thread.start()
    try:
        wait_for(lambda: notify_socket.pending().count("WATCHDOG=1") >= 3, timeout=10,
                 interval=0.02)
        alive = list(notify_socket.pending())
        health["alive"] = False  # the publisher stalls: systemd must get no more pings
        # once serve() has found the exporter dead, any ping it sent before is here
        wait_for(lambda: health["dead_checks"] >= 1, timeout=10, interval=0.01)
        count = len(notify_socket.pending())
        # ten more rounds of the watchdog loop (each 50 ms) find it dead: no ping
        wait_for(lambda: health["dead_checks"] >= 11, timeout=10, interval=0.05)
        assert len(notify_socket.pending()) == count
    finally:
        signals.stop = True
        wake.set()
        thread.join(5)
    assert alive[0] == "READY=1" and alive.count("WATCHDOG=1") >= 3
    assert notify_socket.pending()[-1] == "STOPPING=1"


def start_run(log) -> subprocess.Popen:
    """`run --fake` in a process of its own, its output into `log`."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "exporter", "run", "--fake", "--no-collector.host",
             "--no-collector.infiniband", f"--web.listen-address=127.0.0.1:{free_port()}"],
            stdout=out, stderr=subprocess.STDOUT)


def test_the_main_thread_sleeps_until_a_signal(tmp_path, monkeypatch):
    """Without a watchdog to ping, `run`'s main thread has nothing to do until a signal:
    it must not wake to look (it polled twice a second), and a signal still stops it at
    once, whichever thread the kernel hands it to."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    log = tmp_path / "log"
    proc = start_run(log)
    try:
        wait_for(lambda: "serving on" in log.read_text(), timeout=30, interval=0.1)
        time.sleep(1.0)
        before = wake_ups(proc.pid, proc.pid)  # the main thread's id is the pid
        time.sleep(3.0)
        assert wake_ups(proc.pid, proc.pid) - before <= 1  # polling: 6
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        # promptly: well inside systemd's 20 s TimeoutStopSec; a main thread the signal
        # does not wake would wait for ever (proc.wait raises)
        assert time.monotonic() - t0 < 5.0
    finally:
        stop_process(proc)
    assert proc.returncode == 0, log.read_text()


def test_run_under_a_fake_systemd(notify_socket, tmp_path, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    log = tmp_path / "log"
    proc = start_run(log)
    try:
        assert "READY=1" in notify_socket.drain(until="READY=1", timeout=30), log.read_text()
        notify_socket.drain(until="WATCHDOG=1", timeout=5)
        proc.send_signal(signal.SIGHUP)
        notify_socket.drain(until="RELOADING=1", timeout=10)
        messages = notify_socket.drain(timeout=1)
        reloading = next(i for i, m in enumerate(messages) if m.startswith("RELOADING=1"))
        assert "READY=1" in messages[reloading + 1:], messages
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        messages = notify_socket.drain(until="STOPPING=1", timeout=5)
    finally:
        stop_process(proc)
    assert proc.returncode == 0, log.read_text()
    assert messages.count("WATCHDOG=1") >= 1 and messages[-1] == "STOPPING=1", messages
    assert "reloaded" in log.read_text()
