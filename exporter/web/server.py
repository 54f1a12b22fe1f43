"""HTTP: /metrics from cached bytes, /healthz, /readyz, the live page and its JSON API.

No request does any sampling or rendering work: /metrics writes the bytes of
the latest RenderedSnapshot (gzip-encoded when the scraper accepts it), so
scrape cost does not grow with the number of scrapers or series.

TLS and basic auth come from the web config file (exporter/web/webconfig.py); a
reload swaps them for new connections and requests (set_web_config). What a client can
make the server hold is bounded (ServerLimits): connections (one thread each; idle
and slow ones evicted first, see exporter/web/connections.py), requests answered at
once, time and bytes for a request head, and no request bodies. /healthz and /readyz
mean what exporter/web/probes.py says.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import selectors
import socket
import socketserver
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from exporter import lazy
from exporter.metrics.render import CONTENT_TYPE, RenderedSnapshot
from exporter.web import clientsans
from exporter.web.auth import BasicAuth, Verdict
from exporter.web.connections import BUSY, HEAD, IDLE, Conn, Connections
from exporter.web.probes import Probes
from exporter.web.ratelimit import TokenBucket
from exporter.web.stats import HttpStats
from exporter.web.webconfig import WebConfig

if TYPE_CHECKING:  # imported by the first request for the page or its API
    from exporter.history.recorder import History
    from exporter.web.api import Api

log = logging.getLogger(__name__)

# routed by prefix: the page's modules load on its first request, never on a node only scraped
API_PREFIX, STATIC_PREFIX = "/api/", "/static/"  # of every api.PATHS; static.PREFIX


@dataclass(frozen=True)
class _Security:
    """The web config and its basic auth, swapped as one (a reload must never pair a new
    certificate with old users or the reverse). Read once per connection (TLS) and once
    per request (auth)."""

    web: WebConfig
    auth: BasicAuth | None
    limiter: TokenBucket | None = None  # the web config's rate_limit


@dataclass(frozen=True)
class ServerLimits:
    """Bounds on what clients can make the server hold (see docs/http.md)."""

    max_connections: int = 128  # open connections, one thread each; slow ones are evicted first
    max_active_requests: int = 8  # requests answered at once
    slot_wait_seconds: float = 1.0  # a request waits this long for a slot, then gets 503
    head_timeout_seconds: float = 10.0  # TLS handshake + request line + headers, in total
    idle_timeout_seconds: float = 60.0  # keep-alive wait for the next request
    io_timeout_seconds: float = 10.0  # any single read or write
    max_request_line_bytes: int = 8192
    max_head_bytes: int = 16384  # request line and headers together


class ExporterHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() closes every connection instead of waiting for them
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], current: Callable[[], RenderedSnapshot | None],
                 probes: Probes, web: WebConfig | None = None,
                 limits: ServerLimits | None = None, history: History | None = None):
        """`history`: the state directory's, for /api/v1/history (None: none kept)."""
        self.current = current
        self.probes = probes
        self.limits = limits or ServerLimits()
        self.security = _security(web or WebConfig())
        self.connections = Connections(self.limits.max_connections,
                                       self.limits.head_timeout_seconds)
        self.slots = threading.BoundedSemaphore(self.limits.max_active_requests)
        self.history = history
        self._api: Api | None = None
        self._api_lock = threading.Lock()
        self.busy_refusals = 0
        self._conn_of: dict[socket.socket, Conn] = {}  # accepted socket -> its bookkeeping
        self._conn_lock = threading.Lock()
        host = address[0]
        if ":" in host:
            self.address_family = socket.AF_INET6
        # The accept loop sleeps until a connection, the next request head's deadline or
        # shutdown's byte on this pipe: no polling (each wake-up costs 100-300 us of CPU
        # on a VM; socketserver's loop woke twice a second).
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._stopping = False
        self._serving = threading.Event()
        self._serving.set()  # not serving: shutdown() has nothing to wait for
        self.connections.on_head = self._wake
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        """HTTPServer's, less its socket.getfqdn(host): a reverse DNS query at start, and
        the idna codec with unicodedata (~1.3 MiB resident), for a name nothing reads."""
        socketserver.TCPServer.server_bind(self)
        host, self.server_port = self.server_address[:2]
        self.server_name = str(host)

    @property
    def api(self) -> Api:
        """The JSON API, made by the first request that needs it."""
        with self._api_lock:
            if self._api is None:
                from exporter.web.api import Api

                self._api = Api(self.probes.readiness, history=self.history)
            return self._api

    @property
    def web(self) -> WebConfig:
        return self.security.web

    @property
    def auth(self) -> BasicAuth | None:
        return self.security.auth

    def set_web_config(self, web: WebConfig) -> None:
        """Serve new connections and requests with `web` (one atomic swap); connections
        already open keep the TLS session they have."""
        self.security = _security(web)

    def stats(self) -> HttpStats:
        c = self.connections
        return HttpStats(self.limits.max_connections, c.by_state(), dict(c.evicted_by_state),
                         c.refused, c.timed_out, self.busy_refusals)

    def process_request(self, request, client_address) -> None:
        conn = self.connections.admit(request)
        if conn is None:  # every connection is answering a request: refuse, quickly
            if not self.web.tls:
                with contextlib.suppress(OSError):
                    request.setblocking(False)
                    request.send(_RAW_503)
            self.shutdown_request(request)
            return
        with self._conn_lock:
            self._conn_of[request] = conn
        try:
            super().process_request(request, client_address)
        except RuntimeError:  # cannot start a thread
            self.shutdown_request(request)

    def shutdown_request(self, request) -> None:
        with self._conn_lock:
            conn = self._conn_of.pop(request, None)
        if conn is not None:
            self.connections.release(conn)
            with contextlib.suppress(OSError):
                conn.sock.close()
        super().shutdown_request(request)

    def conn_of(self, request: socket.socket) -> Conn | None:
        with self._conn_lock:
            return self._conn_of.get(request)

    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Accept connections until shutdown(), reaping request heads that took too long
        when their deadline comes (`poll_interval` is ignored: nothing is polled)."""
        self._serving.clear()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self, selectors.EVENT_READ)
                selector.register(self._wake_r, selectors.EVENT_READ)
                while not self._stopping:
                    ready = selector.select(self.connections.next_deadline_in())
                    if self._stopping:
                        break
                    for key, _ in ready:
                        if key.fileobj is self:
                            # socketserver's own step (private, so not in its stubs)
                            self._handle_request_noblock()  # type: ignore[attr-defined]
                        else:
                            os.read(self._wake_r, 512)
                    self.connections.reap()
        finally:
            self._serving.set()

    def shutdown(self) -> None:
        """Stop serve_forever and wait until it has returned."""
        self._stopping = True
        self._wake()
        self._serving.wait()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake-up is pending), or closed
            os.write(self._wake_w, b"\0")

    def handle_error(self, request, client_address) -> None:
        log.debug("connection from %s ended with an error", client_address, exc_info=True)

    def server_close(self) -> None:
        super().server_close()
        self.connections.close_all()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _security(web: WebConfig) -> _Security:
    limit = web.rate_limit
    return _Security(web, BasicAuth(web.users) if web.auth else None,
                     TokenBucket(*limit) if limit else None)


_RAW_503 = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
            b"Connection: close\r\n\r\n")
_RAW_400_PLAIN_TO_TLS = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\n"
                         b"Connection: close\r\n\r\n"
                         b"Client sent an HTTP request to an HTTPS server.\n")
# The reverse: a TLS ClientHello on the plain port. Go's plain server reads it as a request
# line, so the client waits for a ServerHello until a timeout (or, if the hello holds a
# newline byte, gets a 400 quoting binary). One line in clear text instead: a TLS client
# fails its handshake at once (OpenSSL: "wrong version number"), and a person reading the
# bytes sees why.
_TLS_HANDSHAKE = 0x16  # a TLS record's content type; never the first byte of HTTP
_RAW_400_TLS_TO_PLAIN = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\n"
                         b"Connection: close\r\n\r\n"
                         b"Client sent a TLS handshake to an HTTP server.\n")


def _answer_raw(sock: socket.socket, answer: bytes) -> None:
    """Send an answer in clear text (on a TLS socket too: the plain socket's methods),
    then drain briefly so closing does not reset it away."""
    with contextlib.suppress(OSError):
        socket.socket.sendall(sock, answer)
        socket.socket.shutdown(sock, socket.SHUT_WR)
        socket.socket.settimeout(sock, 0.2)
        for _ in range(16):  # at most 16 reads of 4 KiB, 0.2 s each
            if not socket.socket.recv(sock, 4096):
                break


# Probes need no password (kubelet, load balancers); without one they get no detail.
_PROBES = ("/healthz", "/readyz")


class _HeadTooLarge(http.client.LineTooLong):
    """parse_request answers LineTooLong with 431, which is what we want."""


class _LimitedReader:
    """Wraps rfile while the request head is read: at most `budget` bytes in all."""

    def __init__(self, inner, budget: int):
        self.inner = inner
        self.budget = budget

    def readline(self, size: int = -1) -> bytes:
        want = self.budget + 1 if size < 0 else min(size, self.budget + 1)
        line = self.inner.readline(want)
        self.budget -= len(line)
        if self.budget < 0:
            raise _HeadTooLarge("request head")
        return line


class _Closed(Exception):
    """The connection ended before a request could be read (TLS failure, eviction)."""


_QUIET = (TimeoutError, ConnectionError, _Closed)


def _quiet_errors() -> tuple[type[Exception], ...]:
    """What ends a connection without a word: ssl.SSLError too once ssl is loaded (only TLS
    raises it; naming it before would load OpenSSL in a plain-HTTP exporter, lazy.py)."""
    return (*_QUIET, ssl.SSLError) if lazy.loaded(ssl) else _QUIET


def accepts_gzip(header: str) -> bool:
    """Whether an Accept-Encoding value allows gzip (RFC 9110 12.5.3): named with q > 0,
    or matched by `*` with q > 0 and not named; `gzip;q=0` refuses it."""
    star = None
    for item in header.split(",")[:32]:  # a bounded number of codings
        coding, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        coding = coding.lower()
        if coding in ("gzip", "x-gzip"):
            return q > 0
        if coding == "*":
            star = q > 0
    return bool(star)


class _Handler(BaseHTTPRequestHandler):
    server: ExporterHTTPServer
    # No version of ours or of Python in the Server header: it helps only an attacker.
    server_version = "cluster-telemetry-exporter"
    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses its connection
    default_request_version = "HTTP/1.0"  # errors for garbage get a status line (no HTTP/0.9)
    disable_nagle_algorithm = True  # no 40 ms delayed-ACK stall between header and body
    wbufsize = -1  # buffer the response; it is flushed once per request (one send)

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        conn = self.server.conn_of(self.request)
        if conn is None:
            raise _Closed("evicted")
        self.conn = conn
        limits = self.server.limits
        # per connection: StreamRequestHandler reads it from the instance
        self.timeout = limits.io_timeout_seconds  # type: ignore[misc]
        self.request.settimeout(limits.io_timeout_seconds)
        context = self.server.security.web.ssl_context
        if context is not None:
            self.request = self._handshake(context, self.request)
        super().setup()

    def _handshake(self, context: ssl.SSLContext, raw: socket.socket) -> ssl.SSLSocket:
        tls = context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
        if not self.server.connections.set_socket(self.conn, tls):
            tls.close()
            raise _Closed("evicted")
        try:
            tls.do_handshake()
        except ssl.SSLError as exc:
            if exc.reason == "HTTP_REQUEST":  # plain HTTP to the TLS port: say so, as Go does
                _answer_raw(tls, _RAW_400_PLAIN_TO_TLS)
            log.debug("TLS handshake with %s failed: %s", self.client_address[0], exc)
            tls.close()
            raise _Closed("handshake") from None
        except OSError:
            tls.close()
            raise _Closed("handshake") from None
        allowed = self.server.security.web.allowed_sans
        if allowed and not clientsans.admitted(tls.getpeercert(), allowed):
            log.debug("client certificate of %s has no SAN in client_allowed_sans",
                      self.client_address[0])
            tls.close()  # as Go ends the handshake: no request is read
            raise _Closed("handshake")
        return tls

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)

    def handle_one_request(self) -> None:
        """The stdlib's, plus: idle and head time limits, a head size cap, no bodies,
        basic auth before a request slot is taken, and a bounded number of slots."""
        limits = self.server.limits
        try:
            first = self._wait_for_request()
            if not first:
                self.close_connection = True
                return
            if first[0] == _TLS_HANDSHAKE and not isinstance(self.connection, ssl.SSLSocket):
                self.close_connection = True
                _answer_raw(self.connection, _RAW_400_TLS_TO_PLAIN)
                return
            self.server.connections.set_state(self.conn, HEAD)
            head = _LimitedReader(self.rfile, limits.max_head_bytes)
            self.raw_requestline = head.readline(limits.max_request_line_bytes + 1)
            if len(self.raw_requestline) > limits.max_request_line_bytes:
                self.requestline = self.request_version = self.command = ""
                self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            if len(self.raw_requestline.split()) == 2:  # no version: HTTP/0.9, no headers
                self.requestline = self.request_version = self.command = ""
                self.send_error(HTTPStatus.BAD_REQUEST, "HTTP/0.9 is not served")
                return
            rfile, self.rfile = self.rfile, head  # type: ignore[assignment]
            try:
                if not self.parse_request():
                    return  # an error was sent
            finally:
                self.rfile = rfile
            if not hasattr(self, "do_" + self.command):
                self.send_error(HTTPStatus.NOT_IMPLEMENTED,
                                f"Unsupported method ({self.command!r})")
                return
            if self.headers.get("Content-Length", "0").strip() not in ("", "0") or (
                    "Transfer-Encoding" in self.headers):
                self.send_error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                "request bodies are not accepted")
                return
            if not self._within_rate_limit():
                return  # 429 was sent
            self.authorized = self._authorize()
            if self.authorized is None:
                return  # 401 or 429 was sent
            self._answer(getattr(self, "do_" + self.command))
        except _quiet_errors():
            self.close_connection = True
        finally:
            with contextlib.suppress(OSError, ValueError):
                self.wfile.flush()  # responses sent outside _answer (401, 429, errors)
            if not self.close_connection:
                self.server.connections.set_state(self.conn, IDLE)

    def _wait_for_request(self) -> bytes:
        """Wait for the first byte of the next request, up to the idle timeout; what is
        buffered of it (b"" when the connection ended or timed out)."""
        limits = self.server.limits
        self.connection.settimeout(limits.idle_timeout_seconds)
        try:
            return self.rfile.peek(1)[:1]  # type: ignore[attr-defined]
        except (OSError, ValueError):
            return b""
        finally:
            with contextlib.suppress(OSError):
                self.connection.settimeout(limits.io_timeout_seconds)

    def _within_rate_limit(self) -> bool:
        """The web config's rate_limit, before any other work (probes are not counted)."""
        limiter = self.server.security.limiter
        if limiter is None or self.path.split("?", 1)[0] in _PROBES or limiter.allow():
            return True
        self._send(429, "text/plain; charset=utf-8", b"Too Many Requests\n",
                   self.command == "HEAD", {"Retry-After": "1"})
        return False

    def _authorize(self) -> bool | None:
        """True if authenticated, False if auth is off for this path, None if refused."""
        auth = self.server.security.auth
        if auth is None:
            return True
        path = self.path.split("?", 1)[0]
        if path in self.server.security.web.auth_excluded_paths:
            return False
        if path in _PROBES:
            verdict = auth.check(self.headers.get("Authorization")) if (
                "Authorization" in self.headers) else Verdict.DENIED
            return verdict is Verdict.OK  # probes need no password; they get no details
        verdict = auth.check(self.headers.get("Authorization"))
        if verdict is Verdict.OK:
            return True
        if verdict is Verdict.BUSY:
            self._send(429, "text/plain; charset=utf-8", b"too many authentication attempts\n",
                       self.command == "HEAD", {"Retry-After": "1"})
        else:
            self._send(401, "text/plain; charset=utf-8", b"unauthorized\n",
                       self.command == "HEAD",
                       {"WWW-Authenticate": 'Basic realm="cluster-telemetry-exporter"'})
        return None

    def _answer(self, method: Callable[[], None]) -> None:
        server = self.server
        if not server.slots.acquire(timeout=server.limits.slot_wait_seconds):
            server.busy_refusals += 1
            self.send_response(503)
            self.send_header("Retry-After", "1")
            self.send_header("Content-Length", "0")
            self.end_headers()
            self.wfile.flush()
            return
        try:
            server.connections.set_state(self.conn, BUSY)
            method()
            self.wfile.flush()  # actually send the response
        finally:
            server.slots.release()

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, head: bool) -> None:
        path, _, query = self.path.partition("?")
        if path == "/healthz":
            self._healthz(head)
        elif path == "/readyz":
            self._readyz(head)
        elif path == "/metrics":
            self._metrics(head)
        elif path == "/":
            self._page(head)
        elif path.startswith(API_PREFIX):
            self._api(path, query, head)
        elif path.startswith(STATIC_PREFIX):
            self._static(path.removeprefix(STATIC_PREFIX), head)
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n", head)

    def _page(self, head: bool) -> None:
        from exporter.web import page

        s, rendered = self.server, self.server.current()
        self._send(200, "text/html; charset=utf-8", page.page_for(
            rendered, s.probes.readiness(rendered).words, s.api.node), head,
            page.headers_beside(s.web.headers))

    def _api(self, path: str, query: str, head: bool) -> None:
        from exporter.web import api

        if path not in api.PATHS:
            self._send(404, "text/plain; charset=utf-8", b"not found\n", head)
            return
        code, body, headers = self.server.api.reply(
            self.server.current(), path, query,
            accepts_gzip(self.headers.get("Accept-Encoding", "")))
        self._send(code, api.JSON_TYPE, body, head, headers)

    def _static(self, name: str, head: bool) -> None:
        from exporter.web import static

        found = static.asset(name)
        if found is None:
            self._send(404, "text/plain; charset=utf-8", b"not found\n", head)
            return
        headers = {"Cache-Control": static.CACHE_CONTROL, "ETag": found.etag,
                   "X-Content-Type-Options": "nosniff", "Vary": "Accept-Encoding"}
        if static.not_modified(found, self.headers.get("If-None-Match")):
            self._send(304, found.content_type, b"", True, headers)
        elif accepts_gzip(self.headers.get("Accept-Encoding", "")):
            self._send(200, found.content_type, found.gzipped, head,
                       {**headers, "Content-Encoding": "gzip"})
        else:
            self._send(200, found.content_type, found.body, head, headers)

    def _metrics(self, head: bool) -> None:
        rendered = self.server.current()
        if rendered is None:
            self._send(503, "text/plain; charset=utf-8", b"no snapshot yet\n", head)
            return
        vary = {"Vary": "Accept-Encoding"}  # caches must not serve gzip to who refused it
        if accepts_gzip(self.headers.get("Accept-Encoding", "")):
            self._send(200, CONTENT_TYPE, rendered.gzipped, head,
                       {"Content-Encoding": "gzip", **vary})
        else:
            self._send(200, CONTENT_TYPE, rendered.body, head, vary)

    def _healthz(self, head: bool) -> None:
        """Liveness: the exporter samples and serves, whatever the GPUs do."""
        problems = self.server.probes.liveness(self.server.current())
        if problems:
            detail = "; ".join(problems) if self.authorized else "see /healthz with credentials"
            body = f"unhealthy: {detail}\n".encode()
            self._send(503, "text/plain; charset=utf-8", body, head)
        else:
            self._send(200, "text/plain; charset=utf-8", b"ok\n", head)

    def _readyz(self, head: bool) -> None:
        """Readiness and detail: 503 only while not serving fresh data; 200 when degraded,
        with one line per problem (for authenticated clients when auth is on)."""
        readiness = self.server.probes.readiness(self.server.current())
        lines = [readiness.status]
        if self.authorized:
            lines += [f"- {problem}" for problem in readiness.problems]
        elif readiness.problems:
            lines.append("(details: /readyz with credentials)")
        body = ("\n".join(lines) + "\n").encode()
        self._send(200 if readiness.ready else 503, "text/plain; charset=utf-8", body, head)

    def _send(self, code: int, content_type: str, body: bytes, head: bool,
              extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in {**self.server.web.headers, **(extra or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)


def serve_in_thread(server: ExporterHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="cte-http", daemon=True)
    thread.start()
    return thread
