"""Bookkeeping for open HTTP connections: how many, in which state, since when.

The server runs one thread per connection, so the number of connections is the
number of threads; it is capped. A connection is in one of three states:

- ``head``: TLS handshake and request head being read. Limited in total time
  (``head_timeout``), not per read, so a client sending one byte every few
  seconds (slowloris) is cut off all the same.
- ``idle``: keep-alive, waiting for the next request (``idle_timeout``).
- ``busy``: a request being answered; never evicted.

When the cap is reached, a new connection evicts, in this order:

1. the idle keep-alive connection idle the longest, skipping any whose next request
   has already arrived (its bytes wait in the socket: it is about to be a request);
2. only when no connection is idle, the oldest ``head`` connection.

Why idle first: an idle connection has had its answer, and a client that reuses
connections (Prometheus) retries a GET on a closed idle connection, so evicting
one costs no request. A connection in ``head`` may be a scraper whose request is on
its way; a flood of clients that make one request and then sit idle must not be
able to push it out (15 of 145 fresh scrapes failed at 200 new connections a second
when ``head`` went first). Slowloris clients, which never finish a head, still evict
each other, oldest first. Only when every connection is busy is a new one refused.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

HEAD, IDLE, BUSY = "head", "idle", "busy"
STATES = (HEAD, IDLE, BUSY)


@dataclass(eq=False)
class Conn:
    sock: socket.socket
    state: str = HEAD
    since: float = field(default_factory=time.monotonic)
    closed: bool = False


def _request_waiting(sock: socket.socket) -> bool:
    """True if the peer has sent bytes we have not read yet (its next request).

    poll() with no wait first: Python's recv on a socket with a timeout would wait for
    data before peeking, even with MSG_DONTWAIT. Then a peek at the kernel's buffer with
    the plain socket method, so it works on an SSLSocket too without touching TLS
    state; a peer that closed (b"") has no request waiting."""
    try:
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        if not poller.poll(0):
            return False
        return bool(socket.socket.recv(sock, 1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except (OSError, ValueError):  # closed meanwhile (fileno -1) or reset
        return False


class Connections:
    def __init__(self, cap: int, head_timeout: float):
        self.cap = cap
        self.head_timeout = head_timeout
        self._lock = threading.Lock()
        self._open: dict[int, Conn] = {}  # id(Conn) -> Conn
        self.evicted_by_state: dict[str, int] = {HEAD: 0, IDLE: 0}
        self.refused = 0
        self.timed_out = 0
        # called when a connection starts a request head from its own thread, so that
        # the accept loop sleeping until the next deadline takes this one into account
        self.on_head: Callable[[], None] | None = None

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    @property
    def evicted(self) -> int:
        return sum(self.evicted_by_state.values())

    def by_state(self) -> dict[str, int]:
        """Open connections by state, every state present."""
        counts = dict.fromkeys(STATES, 0)
        with self._lock:
            for conn in self._open.values():
                counts[conn.state] += 1
        return counts

    def admit(self, sock: socket.socket) -> Conn | None:
        """Register a new connection, evicting an idle or slow one if full; None: refuse it."""
        self.reap()
        with self._lock:
            if len(self._open) >= self.cap:
                victim = self._victim()
                if victim is None:
                    self.refused += 1
                    return None
                self.evicted_by_state[victim.state] += 1
                self._close(victim)
            conn = Conn(sock)
            self._open[id(conn)] = conn
            return conn

    def set_state(self, conn: Conn, state: str) -> None:
        with self._lock:
            if conn.state == state:
                return
            conn.state, conn.since = state, time.monotonic()
        if state == HEAD and self.on_head is not None:
            self.on_head()

    def next_deadline_in(self) -> float | None:
        """Seconds until the oldest request head in progress times out (reap() then cuts
        it off); None when no connection is reading one."""
        with self._lock:
            since = min((c.since for c in self._open.values() if c.state == HEAD), default=None)
        if since is None:
            return None
        return max(0.0, since + self.head_timeout - time.monotonic()) + 0.001

    def set_socket(self, conn: Conn, sock: socket.socket) -> bool:
        """The TLS-wrapped socket replaces the raw one; False if already evicted."""
        with self._lock:
            conn.sock = sock
            return not conn.closed

    def release(self, conn: Conn) -> None:
        with self._lock:
            self._open.pop(id(conn), None)
            conn.closed = True

    def reap(self) -> None:
        """Cut off connections whose request head has taken too long."""
        deadline = time.monotonic() - self.head_timeout
        with self._lock:
            for conn in [c for c in self._open.values() if c.state == HEAD and c.since < deadline]:
                self.timed_out += 1
                self._close(conn)

    def close_all(self) -> None:
        with self._lock:
            for conn in list(self._open.values()):
                self._close(conn)

    def _victim(self) -> Conn | None:
        """The connection to evict (see the module docstring); None if all are busy."""
        idle = sorted((c for c in self._open.values() if c.state == IDLE),
                      key=lambda c: c.since)
        for conn in idle:  # at most `cap` non-blocking peeks, under the lock
            if not _request_waiting(conn.sock):
                return conn
        heads = [c for c in self._open.values() if c.state == HEAD]
        if heads:
            return min(heads, key=lambda c: c.since)
        return idle[0] if idle else None  # every idle one has a request waiting

    def _close(self, conn: Conn) -> None:
        """Wake the connection's thread: its blocked read returns and it exits."""
        self._open.pop(id(conn), None)
        conn.closed = True
        # The plain socket method, also on an SSLSocket: no TLS close_notify from
        # this thread while the owner thread may be inside an SSL read.
        with contextlib.suppress(OSError):
            socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)
