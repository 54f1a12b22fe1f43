"""Bookkeeping for open HTTP connections: how many, in which state, since when.

The server runs one thread per connection, so the number of connections is the
number of threads; it is capped. A connection is in one of three states:

- ``head``: TLS handshake and request head being read. Limited in total time
  (``head_timeout``), not per read, so a client sending one byte every few
  seconds (slowloris) is cut off all the same.
- ``idle``: keep-alive, waiting for the next request (``idle_timeout``).
- ``busy``: a request being answered; never evicted.

When the cap is reached, a new connection evicts the oldest ``head`` connection
(then the oldest ``idle`` one): a scraper sends its request at once, so it is
never the oldest half-read connection, and slow clients cannot lock it out.
Only when every connection is busy is a new one refused.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field

HEAD, IDLE, BUSY = "head", "idle", "busy"


@dataclass(eq=False)
class Conn:
    sock: socket.socket
    state: str = HEAD
    since: float = field(default_factory=time.monotonic)
    closed: bool = False


class Connections:
    def __init__(self, cap: int, head_timeout: float):
        self.cap = cap
        self.head_timeout = head_timeout
        self._lock = threading.Lock()
        self._open: dict[int, Conn] = {}  # id(Conn) -> Conn
        self.evicted = 0
        self.refused = 0
        self.timed_out = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def admit(self, sock: socket.socket) -> Conn | None:
        """Register a new connection, evicting a slow one if full; None means refuse it."""
        self.reap()
        with self._lock:
            if len(self._open) >= self.cap:
                victim = self._oldest(HEAD) or self._oldest(IDLE)
                if victim is None:
                    self.refused += 1
                    return None
                self.evicted += 1
                self._close(victim)
            conn = Conn(sock)
            self._open[id(conn)] = conn
            return conn

    def set_state(self, conn: Conn, state: str) -> None:
        with self._lock:
            if conn.state != state:
                conn.state, conn.since = state, time.monotonic()

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

    def _oldest(self, state: str) -> Conn | None:
        candidates = [c for c in self._open.values() if c.state == state]
        return min(candidates, key=lambda c: c.since) if candidates else None

    def _close(self, conn: Conn) -> None:
        """Wake the connection's thread: its blocked read returns and it exits."""
        self._open.pop(id(conn), None)
        conn.closed = True
        # The plain socket method, also on an SSLSocket: no TLS close_notify from
        # this thread while the owner thread may be inside an SSL read.
        with contextlib.suppress(OSError):
            socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)
