"""`health --timeout` bounds the whole exchange (connect, request, the full answer), not
each read: a server that answers one byte every half second must not hold the command,
nor Slurm's HealthCheckProgram, past its timeout. The server is real, on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests.test_health_command import FakeSlurm

# a verdict would follow, if the reader waited for its ~100 kB at two bytes a second
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
BYTE_EVERY = 0.5
SERVE_AT_MOST = 60.0  # the server's own bound: it stops whatever the client does
TIMEOUT = 3


class Dribbler:
    """Accepts connections and sends each one byte every BYTE_EVERY seconds."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._dribble, args=(conn,), daemon=True).start()

    def _dribble(self, conn: socket.socket) -> None:
        end = time.monotonic() + SERVE_AT_MOST
        with conn:
            for i in range(len(ANSWER) + 100_000):
                if self.stop.wait(BYTE_EVERY) or time.monotonic() > end:
                    return
                try:
                    conn.sendall(ANSWER[i:i + 1] if i < len(ANSWER) else b" ")
                except OSError:  # the client gave up
                    return

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


@pytest.fixture
def dribbler() -> Iterator[Dribbler]:
    server = Dribbler()
    try:
        yield server
    finally:
        server.close()


def health(port: int, *flags: str, env: dict[str, str] | None = None) -> tuple[
        subprocess.CompletedProcess, float]:
    start = time.monotonic()
    # bounded: a command that hangs fails the test here instead of holding it
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "health", f"--web.listen-address=127.0.0.1:{port}",
         "--timeout", str(TIMEOUT), *flags], capture_output=True, text=True, timeout=30,
        env={**os.environ, **(env or {})})
    return done, time.monotonic() - start


def test_a_slow_answer_is_unknown_within_the_timeout(dribbler):
    done, took = health(dribbler.port)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.startswith(f"unknown: cannot reach the exporter at "
                                  f"http://127.0.0.1:{dribbler.port}/api/v1/health: no full "
                                  f"answer within {TIMEOUT} s"), done.stdout
    # the timeout, plus the interpreter's start (slow on a loaded machine), never minutes
    assert took < TIMEOUT + 15, took


def test_slurm_drain_judges_a_slow_answer_unknown_and_never_hangs(dribbler, tmp_path,
                                                                   monkeypatch):
    slurm = FakeSlurm(tmp_path, monkeypatch)
    slurm.state("MIXED")
    done, took = health(dribbler.port, "--slurm-drain")
    assert done.returncode == 0, done.stdout + done.stderr  # HealthCheckProgram: unknown
    assert done.stdout.startswith("unknown: ") and "slurm: nothing done" in done.stdout
    assert slurm.calls() == [] and took < TIMEOUT + 15, took


def test_a_server_that_accepts_and_says_nothing_is_unknown_too(capsys):
    from exporter.cli import main

    with socket.create_server(("127.0.0.1", 0)) as silent:  # backlog accepts; never answers
        start = time.monotonic()
        code = main(["health", f"--web.listen-address=127.0.0.1:{silent.getsockname()[1]}",
                     "--timeout", "1"])
        took = time.monotonic() - start
    assert code == 2 and "no full answer within 1 s" in capsys.readouterr().out
    assert took < 5, took
