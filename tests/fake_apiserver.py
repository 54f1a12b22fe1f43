"""A fake Kubernetes API server over HTTPS on loopback: pods listed and watched as the
real one serves them (`/api/v1/pods` with a `spec.nodeName` field selector, a PodList
with a resourceVersion, a watch stream of JSON events with bookmarks, `410 Gone` for a
version it no longer keeps), and the faults tests need: 401 without the token, 403
(RBAC), a watch whose connection is reset."""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class FakeApiServer:
    def __init__(self, cert: Path, key: Path, token: str = "s3cret") -> None:
        self.token = token
        self.lock = threading.Condition()
        self.pods: dict[tuple[str, str], dict] = {}  # (namespace, name) -> pod object
        self.version = 100
        self.events: list[tuple[int, dict]] = []  # (resourceVersion, event)
        self.oldest = 0  # versions before this are "compacted": a watch from one is 410
        self.forbidden = False
        self.reset_watches = False  # reset every open watch's connection (TCP RST)
        self.requests: list[tuple[str, dict[str, list[str]], str]] = []
        handler = self._handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FakeApiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.lock:
            self.reset_watches = True
            self.lock.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # -- what tests change ------------------------------------------------------------------
    def put(self, namespace: str, name: str, uid: str, labels: dict[str, str] | None = None,
            node: str = "node-7") -> None:
        with self.lock:
            kind = "MODIFIED" if (namespace, name) in self.pods else "ADDED"
            self._record(kind, self._object(namespace, name, uid, labels or {}, node))

    def delete(self, namespace: str, name: str) -> None:
        with self.lock:
            pod = self.pods.get((namespace, name))
            if pod is not None:
                self._record("DELETED", pod)

    def compact(self) -> None:
        """Forget the history: a watch from an older version gets 410 Gone."""
        with self.lock:
            self.oldest = self.version + 1

    def _object(self, namespace, name, uid, labels, node) -> dict:
        return {"kind": "Pod", "apiVersion": "v1",
                "metadata": {"name": name, "namespace": namespace, "uid": uid,
                             "labels": labels, "resourceVersion": ""},
                "spec": {"nodeName": node}, "status": {"phase": "Running"}}

    def _record(self, kind: str, pod: dict) -> None:
        self.version += 1
        pod = json.loads(json.dumps(pod))
        pod["metadata"]["resourceVersion"] = str(self.version)
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        if kind == "DELETED":
            self.pods.pop(key, None)
        else:
            self.pods[key] = pod
        self.events.append((self.version, {"type": kind, "object": pod}))
        self.lock.notify_all()

    # -- serving ----------------------------------------------------------------------------
    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                auth = self.headers.get("Authorization", "")
                fake.requests.append((url.path, query, auth))
                if url.path != "/api/v1/pods":
                    return self._status(404, "NotFound", "no such path")
                if auth != f"Bearer {fake.token}":
                    return self._status(401, "Unauthorized", "Unauthorized")
                if fake.forbidden:
                    return self._status(403, "Forbidden", 'pods is forbidden: User '
                                        '"system:serviceaccount:monitoring:cte" cannot list '
                                        'resource "pods" in API group "" at the cluster scope')
                selector = query.get("fieldSelector", [""])[0]
                node = selector.removeprefix("spec.nodeName=")
                if query.get("watch", [""])[0] in ("1", "true"):
                    return self._watch(node, int(query.get("resourceVersion", ["0"])[0]))
                with fake.lock:
                    items = [p for p in fake.pods.values()
                             if not selector or p["spec"]["nodeName"] == node]
                    body = {"kind": "PodList", "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(fake.version)},
                            "items": items}
                self._send(200, json.dumps(body).encode())

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(code, json.dumps({"kind": "Status", "apiVersion": "v1",
                                             "status": "Failure", "message": message,
                                             "reason": reason, "code": code}).encode())

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _watch(self, node: str, since: int) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()  # no length: the stream ends when the server closes it
                if since < fake.oldest:
                    self._line({"type": "ERROR", "object": {
                        "kind": "Status", "code": 410, "reason": "Expired",
                        "message": f"too old resource version: {since}"}})
                    return
                sent = since
                while True:
                    with fake.lock:
                        fake.lock.wait_for(lambda after=sent: fake.reset_watches or any(
                            v > after for v, _ in fake.events), timeout=0.5)
                        if fake.reset_watches:
                            break
                        new = [(v, e) for v, e in fake.events if v > sent]
                    for version, event in new:
                        sent = version
                        if event["object"]["spec"]["nodeName"] == node:
                            self._line(event)
                # a reset: RST rather than an orderly end
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
                self.close_connection = True

            def _line(self, event: dict) -> None:
                self.wfile.write(json.dumps(event).encode() + b"\n")
                self.wfile.flush()

        return Handler
