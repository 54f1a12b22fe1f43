"""The accept loop sleeps until it has something to do: a connection, the deadline of a
request head, or shutdown. No polling, and still no slow head outlives its limit."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from exporter.web.probes import Probes
from exporter.web.server import ExporterHTTPServer, ServerLimits, serve_in_thread
from tests.tools import wake_ups

LIMITS = ServerLimits(head_timeout_seconds=1.0, idle_timeout_seconds=10.0)
# What is promised: shutdown is prompt, and a slow head is cut off soon after its limit.
# A loop that is not woken waits forever (or until a poll, which the wake-up count
# catches), so bounds of seconds tell it apart however loaded the machine (typically
# shutdown takes a millisecond and the cut-off comes within 0.1 s of the limit).
SHUTDOWN_BOUND = 2.0
CUT_OFF_MARGIN = 2.0


@pytest.fixture
def server():
    server = ExporterHTTPServer(("127.0.0.1", 0), lambda: None, Probes(60.0),
                                limits=LIMITS)
    thread = serve_in_thread(server)
    yield server, thread
    stopped_within(server, SHUTDOWN_BOUND)  # a hung loop must fail the test, not hang it
    server.server_close()
    thread.join(2)


def stopped_within(server: ExporterHTTPServer, seconds: float) -> bool:
    """shutdown() in a thread of its own, which waits for the loop to return."""
    stopper = threading.Thread(target=server.shutdown, daemon=True)
    stopper.start()
    stopper.join(seconds)
    return not stopper.is_alive()


def test_an_idle_server_does_not_wake_and_stops_at_once(server):
    http, thread = server
    time.sleep(0.2)
    before = wake_ups(thread.native_id)
    time.sleep(2.0)
    assert wake_ups(thread.native_id) - before == 0  # socketserver's loop: 4 in 2 s
    assert stopped_within(http, SHUTDOWN_BOUND)
    thread.join(SHUTDOWN_BOUND)
    assert not thread.is_alive()


def read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_a_slow_head_on_a_kept_alive_connection_is_cut_off_in_time(server):
    """The connection's thread, not the accept loop, sees its next request start: the
    loop, asleep with no deadline, must be told."""
    http, _ = server
    with socket.create_connection(("127.0.0.1", http.server_address[1]), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock).startswith(b"HTTP/1.1 503")  # no snapshot yet
        time.sleep(1.5)  # idle, and the first head's deadline gone: the loop sleeps
        t0, closed_after = time.monotonic(), None
        for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 100:  # 6 s: past the bound
            try:
                sock.send(bytes([byte]))
                if sock.recv(1, socket.MSG_DONTWAIT) == b"":
                    raise ConnectionResetError
            except BlockingIOError:
                pass
            except OSError:
                closed_after = time.monotonic() - t0
                break
            time.sleep(0.05)
    assert closed_after is not None
    assert closed_after < LIMITS.head_timeout_seconds + CUT_OFF_MARGIN
    assert http.connections.timed_out == 1
