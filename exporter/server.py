"""HTTP: /metrics from cached bytes, /healthz, and a small landing page.

No request does any sampling or rendering work: /metrics writes the bytes of
the latest RenderedSnapshot (gzip-encoded when the scraper accepts it), so
scrape cost does not grow with the number of scrapers or series.
"""

from __future__ import annotations

import html
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from exporter import __version__
from exporter.metrics.render import CONTENT_TYPE, RenderedSnapshot

log = logging.getLogger(__name__)


class HealthCheck:
    """Decides whether sampling is fresh enough to call the exporter healthy."""

    def __init__(self, stale_after_seconds: float):
        self.stale_after = stale_after_seconds

    def problems(self, rendered: RenderedSnapshot | None, now: float | None = None) -> list[str]:
        now = time.time() if now is None else now
        if rendered is None:
            return ["no snapshot published yet"]
        snap = rendered.snapshot
        out = []
        if now - snap.time > self.stale_after:
            out.append(f"publisher stalled: last snapshot {now - snap.time:.1f} s ago")
        for name, loop in (("power", snap.power_loop), ("sweep", snap.sweep_loop)):
            if not loop.last_completed:
                continue
            age = now - loop.last_completed
            if age > self.stale_after:
                inside = f" (stuck in {loop.busy})" if loop.busy else ""
                out.append(f"{name} loop stale: last completed {age:.1f} s ago{inside}")
        for gpu, since in sorted(snap.hung.items()):
            out.append(f"GPU {gpu} stuck in an NVML call for {now - since:.1f} s "
                       "(its data is left out; other GPUs are sampled)")
        return out


class ExporterHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], current: Callable[[], RenderedSnapshot | None],
                 health: HealthCheck):
        self.current = current
        self.health = health
        host = address[0]
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: ExporterHTTPServer
    server_version = f"cluster-telemetry-exporter/{__version__}"
    timeout = 10  # seconds a client may take to send its request
    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses its connection
    disable_nagle_algorithm = True  # no 40 ms delayed-ACK stall between header and body
    wbufsize = -1  # buffer the response; it is flushed once per request (one send)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, head: bool) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._metrics(head)
        elif path == "/healthz":
            self._healthz(head)
        elif path == "/":
            self._send(200, "text/html; charset=utf-8", _landing_page(self.server), head)
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n", head)

    def _metrics(self, head: bool) -> None:
        rendered = self.server.current()
        if rendered is None:
            self._send(503, "text/plain; charset=utf-8", b"no snapshot yet\n", head)
            return
        accepts = self.headers.get("Accept-Encoding", "")
        if "gzip" in accepts:
            self._send(200, CONTENT_TYPE, rendered.gzipped, head, {"Content-Encoding": "gzip"})
        else:
            self._send(200, CONTENT_TYPE, rendered.body, head)

    def _healthz(self, head: bool) -> None:
        problems = self.server.health.problems(self.server.current())
        if problems:
            body = ("stale: " + "; ".join(problems) + "\n").encode()
            self._send(503, "text/plain; charset=utf-8", body, head)
        else:
            self._send(200, "text/plain; charset=utf-8", b"ok\n", head)

    def _send(self, code: int, content_type: str, body: bytes, head: bool,
              extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)


def _landing_page(server: ExporterHTTPServer) -> bytes:
    rendered = server.current()
    backend = "starting"
    gpus = 0
    if rendered is not None:
        snap = rendered.snapshot
        backend = snap.backend + (f" (scenario {snap.scenario})" if snap.backend == "fake" else "")
        gpus = snap.gpu_count
    problems = server.health.problems(rendered)
    status = "ok" if not problems else "; ".join(problems)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>cluster-telemetry-exporter</title></head>
<body><h1>cluster-telemetry-exporter {html.escape(__version__)}</h1>
<p>GPUs: <span id="gpus">{gpus}</span> &middot;
backend: <span id="backend">{html.escape(backend)}</span> &middot;
health: <span id="health">{html.escape(status)}</span></p>
<ul><li><a href="/metrics">/metrics</a></li><li><a href="/healthz">/healthz</a></li></ul>
</body></html>
""".encode()


def serve_in_thread(server: ExporterHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="cte-http", daemon=True)
    thread.start()
    return thread
