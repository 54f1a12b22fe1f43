"""Where the local exporter listens and how to reach it: the address, TLS and basic auth
of the same config file and web config as `run` (or the same --web.* flags).

TLS: the client trusts exactly the certificate the exporter serves (the web config's
cert_file or inline cert), as a trust anchor of its own, so a self-signed certificate and
one from a CA both verify, and the host name (we connect to a loopback address, the
certificate names the node) is not compared. Basic auth: the web config holds only bcrypt
hashes, so the user and a password file are the command's own flags.

The timeout is a deadline over the whole exchange (connect, TLS handshake, request, the
full answer): each socket call waits only for what is left of it, so a server that
answers a byte at a time cannot hold the command (or Slurm's HealthCheckProgram) longer.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import logging
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from exporter.regularfile import read_regular
from exporter.web.webconfig import load_web_config
from exporter.yamlfile import ConfigError, load_yaml_file

PATH = "/api/v1/health"
MAX_ANSWER_BYTES = 8 << 20  # a verdict of 64 GPUs is well under 1 MiB


class Unreachable(Exception):
    """The exporter could not be asked, or is not ready; the message says why."""


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    context: ssl.SSLContext | None = None
    authorization: str | None = None
    timeout: float = 5.0

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.context else 'http'}://{host}:{self.port}{PATH}"


def connect_host(listen_host: str) -> str:
    """The address to ask an exporter listening on `listen_host` at: every address
    ('', 0.0.0.0, ::) is asked on loopback."""
    if listen_host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if listen_host == "::":
        return "::1"
    return listen_host


def _served_certificate(web_config_file: str) -> tuple[str | None, str | None]:
    """(cert file path, inline PEM) of the web config's tls_server_config."""
    data = load_yaml_file(web_config_file)
    tls = (data or {}).get("tls_server_config") or {}
    name, inline = tls.get("cert_file") or None, tls.get("cert") or None
    if name is not None and not Path(name).is_absolute():
        name = str(Path(web_config_file).resolve().parent / name)
    return name, inline


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """The web config's warnings (a loose key, a certificate near its end) are the
    exporter's to log; here they would repeat on every run of the plugin."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def tls_context(web_config_file: str, client_cert: str | None = None,
                client_key: str | None = None) -> ssl.SSLContext | None:
    """The client side of the web config: None for plain HTTP. The file is checked as
    `run` checks it (a ConfigError names file, line and key)."""
    with _quiet("exporter.web"):
        tls = bool(web_config_file) and load_web_config(web_config_file).tls
    if not tls:
        if client_cert:
            raise ConfigError("--tls.client-cert: the exporter serves plain HTTP "
                              "(no tls_server_config in its web config)")
        return None
    cert_file, inline = _served_certificate(web_config_file)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # loopback: the certificate itself is the anchor
    context.verify_mode = ssl.CERT_REQUIRED
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    context.load_verify_locations(cafile=cert_file, cadata=inline)
    _client_certificate(context, client_cert, client_key)
    return context


def system_tls_context(client_cert: str | None = None,
                       client_key: str | None = None) -> ssl.SSLContext:
    """An https:// URL without a web config: the system's CAs, the host name checked."""
    context = ssl.create_default_context()
    _client_certificate(context, client_cert, client_key)
    return context


def _client_certificate(context: ssl.SSLContext, client_cert: str | None,
                        client_key: str | None) -> None:
    if client_cert:
        try:
            context.load_cert_chain(client_cert, client_key or None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--tls.client-cert {client_cert}: cannot load it with its "
                              f"key ({getattr(exc, 'strerror', None) or exc})") from None
    elif client_key:
        raise ConfigError("--tls.client-key needs --tls.client-cert")


def authorization(username: str | None, password_file: str | None) -> str | None:
    """The Authorization header for basic auth, or None."""
    if not username and not password_file:
        return None
    if not username or not password_file:
        raise ConfigError("--auth.username and --auth.password-file go together")
    try:
        password = read_regular(Path(password_file)).decode().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--auth.password-file {password_file}: cannot read it "
                          f"({getattr(exc, 'strerror', None) or exc})") from None
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return f"Basic {token}"


class _Deadline:
    """The end of the exchange; left() is what remains, TimeoutError once it is over."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the deadline passed")
        return left


class _DeadlineReader(io.RawIOBase):
    """The socket's bytes for http.client's reader, each receive bounded by the deadline."""

    def __init__(self, owner: _DeadlineSocket) -> None:
        self._owner = owner

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 - io's signature
        sock = self._owner.sock
        sock.settimeout(self._owner.deadline.left())
        return sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            super().close()
            self._owner.release()


class _DeadlineSocket:
    """What http.client asks of its socket (sendall, makefile, close), each call bounded by
    what is left of the deadline: its own timeout bounds each call, not their sum. As a
    socket's, its reader keeps it open after close() (http.client closes the connection
    and reads on when the server closes after its answer)."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self.sock, self.deadline = sock, deadline
        self._users = 1  # this and each open reader
        self._closed = False

    def sendall(self, data: bytes) -> None:
        self.sock.settimeout(self.deadline.left())
        self.sock.sendall(data)

    def makefile(self, mode: str = "rb", *args: object, **kwargs: object) -> io.BufferedReader:
        self._users += 1
        return io.BufferedReader(_DeadlineReader(self))

    def release(self) -> None:
        self._users -= 1
        if self._users == 0:
            self.sock.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.release()


def _connect(target: Target, deadline: _Deadline) -> socket.socket:
    """A connected socket (TLS handshake done), within the deadline."""
    sock = socket.create_connection((target.host, target.port), timeout=deadline.left())
    try:
        # the handshake is one call, bounded as a whole by the socket's timeout
        sock.settimeout(deadline.left())
        if target.context is not None:
            sock = target.context.wrap_socket(sock, server_hostname=target.host)
        return sock
    except BaseException:
        sock.close()
        raise


def ask(target: Target) -> bytes:
    """The body of a 200 answer to GET /api/v1/health, the whole exchange within
    target.timeout; Unreachable otherwise."""
    deadline = _Deadline(target.timeout)
    conn = http.client.HTTPConnection(target.host, target.port)
    headers = {"Accept-Encoding": "identity"}
    if target.authorization:
        headers["Authorization"] = target.authorization
    try:
        # http.client connects only without a socket: it is handed ours, deadline and all
        conn.sock = _DeadlineSocket(_connect(target, deadline), deadline)
        conn.request("GET", PATH, headers=headers)
        response = conn.getresponse()
        body = response.read(MAX_ANSWER_BYTES + 1)
    except TimeoutError:  # socket.timeout too
        raise Unreachable(f"cannot reach the exporter at {target.url}: no full answer "
                          f"within {deadline.seconds:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
        raise Unreachable(f"cannot reach the exporter at {target.url}: "
                          f"{reason or type(exc).__name__}") from None
    finally:
        conn.close()
    if response.status == 200 and len(body) <= MAX_ANSWER_BYTES:
        return body
    raise Unreachable(_refusal(target, response.status, len(body)))


def _refusal(target: Target, status: int, size: int) -> str:
    if status == 200:
        return f"{target.url} answered more than {MAX_ANSWER_BYTES} bytes"
    if status == 503:
        return f"the exporter at {target.url} is not ready (HTTP 503)"
    if status == 401:
        return (f"{target.url} asks for basic auth: give --auth.username and "
                "--auth.password-file, or list /api/v1/health in the web config's "
                "basic_auth_excluded_paths" if target.authorization is None else
                f"{target.url} refused the credentials (HTTP 401)")
    if status == 404:
        return f"{target.url}: not found (an exporter without health checks?)"
    return f"{target.url} answered HTTP {status}"
