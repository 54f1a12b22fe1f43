"""The pods on this node, from the Kubernetes API server: their UID and labels.

The kubelet's pod-resources answer names a pod by namespace and name only; a
StatefulSet's pod keeps its name across restarts, so the UID (and the labels operators
join on: team, queue, job name) come from the API server. One thread lists
``/api/v1/pods?fieldSelector=spec.nodeName=<node>`` and then watches from the list's
``resourceVersion`` (bookmarks on, ``timeoutSeconds`` 300); a watch that ends is resumed
from the last version seen, one that says ``410 Gone`` (the version is too old) lists
afresh. Any failure (no answer, a reset connection, 401, 403, garbage) waits before the
next try, doubling from 1 s to 60 s and back to 1 s after a success.

In-cluster configuration, as client-go's ``rest.InClusterConfig`` reads it: the API
server at ``KUBERNETES_SERVICE_HOST``:``KUBERNETES_SERVICE_PORT``, the service account's
token (read again for every request: projected tokens are rotated) and CA under
``/var/run/secrets/kubernetes.io/serviceaccount``, and the node from ``NODE_NAME`` (the
downward API's ``spec.nodeName``). :class:`InCluster` takes them all as arguments, so
tests point it at a fake server.

What is kept is bounded: at most :data:`MAX_PODS` pods (a node runs at most a few
hundred), the labels of each (Kubernetes allows 63-character names and values), and a
watch event line of at most :data:`MAX_LINE_BYTES`.

The pods that are known stay known while the API server cannot be read (a pod's UID does
not change while it lives); :attr:`PodWatcher.problem` says why it cannot, for ``/readyz``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from exporter import jsontext

__all__ = ["API_FAILURES", "MAX_PODS", "SERVICE_ACCOUNT_DIR", "InCluster", "PodMeta",
           "PodWatcher", "in_cluster"]

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: Pods kept at most (Kubernetes' default is 110 a node).
MAX_PODS = 4096
MAX_LINE_BYTES = 4 << 20
MAX_LIST_BYTES = 64 << 20
WATCH_SECONDS = 300
BACKOFF_MIN, BACKOFF_MAX = 1.0, 60.0
#: Why a call to the API server failed (the self-metric's `reason` label).
API_FAILURES = ("unauthorized", "forbidden", "unavailable", "bad_response", "gone")


@dataclass(frozen=True)
class PodMeta:
    uid: str
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class InCluster:
    host: str
    port: int
    token_path: str
    ca_path: str
    node: str


def in_cluster(environ: Mapping[str, str] | None = None,
               directory: str | None = None) -> InCluster | str:
    """The in-cluster configuration, or why there is none (one line)."""
    env = os.environ if environ is None else environ
    directory = SERVICE_ACCOUNT_DIR if directory is None else directory
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port.isdigit():
        return ("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: not "
                "running in a pod, so pod labels cannot be read")
    node = env.get("NODE_NAME", "")
    if not node:
        return "NODE_NAME is not set (the downward API's spec.nodeName): pods cannot be listed"
    return InCluster(host, int(port), os.path.join(directory, "token"),
                     os.path.join(directory, "ca.crt"), node)


class _Failure(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


def _pod(item: Any) -> tuple[tuple[str, str], PodMeta] | None:
    meta = item.get("metadata") if isinstance(item, dict) else None
    if not isinstance(meta, dict):
        return None
    name, namespace, uid = meta.get("name"), meta.get("namespace"), meta.get("uid")
    if not (isinstance(name, str) and isinstance(namespace, str) and isinstance(uid, str)
            and name and namespace and uid):
        return None
    raw = meta.get("labels") or {}
    labels = ({k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}
              if isinstance(raw, dict) else {})
    return (namespace, name), PodMeta(uid, MappingProxyType(labels))


class PodWatcher:
    """Keeps the pods of one node, listed then watched on a thread of its own."""

    def __init__(self, config: InCluster | str, timeout: float = 10.0,
                 sleep: Callable[[float], bool] | None = None) -> None:
        """`config`: where to ask, or why not (then nothing is asked and `problem` says
        so). `sleep(seconds)` waits between tries and returns True when stopped."""
        self.config = config
        self.timeout = timeout
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], PodMeta] = {}
        self._version = ""
        self._conn: http.client.HTTPSConnection | None = None
        # the connection's socket: a response without a length takes it over from the
        # connection (whose .sock is then None), and stop() must still reach it
        self._sock: Any = None
        self._thread: threading.Thread | None = None
        self.failures = dict.fromkeys(API_FAILURES, 0)
        self.up = False
        self.synced = False  # a list has succeeded at least once
        self.problem = config if isinstance(config, str) else ""
        self.lists = self.watches = 0

    # -- what the collector reads ---------------------------------------------------------
    def pods(self) -> Mapping[tuple[str, str], PodMeta]:
        with self._lock:
            return MappingProxyType(dict(self._pods))

    # -- the thread -----------------------------------------------------------------------
    def start(self) -> PodWatcher:
        if isinstance(self.config, str):
            log.warning("kubernetes collector: %s", self.config)
            return self
        self._thread = threading.Thread(target=self._run, name="kubernetes-pods",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # wakes a blocked read
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        delay = BACKOFF_MIN
        while not self._stop.is_set():
            try:
                if not self._version:
                    self._list()
                    self.lists += 1
                self.up, self.problem, delay = True, "", BACKOFF_MIN
                self._watch()
                self.watches += 1
                continue  # a watch that timed out: resume from the last version
            except _Gone:
                self.failures["gone"] += 1
                self._version = ""
                continue
            except _Failure as exc:
                self._failed(exc.reason, str(exc))
            except (OSError, http.client.HTTPException) as exc:
                if self._stop.is_set():
                    return
                self._failed("unavailable", f"the API server did not answer: {exc}")
            except Exception as exc:  # never let the thread die: the pods would go stale
                log.exception("kubernetes API: unexpected failure")
                self._failed("bad_response", f"unexpected failure: {exc!r}")
            finally:
                self._close()
            if self._sleep(delay):
                return
            delay = min(BACKOFF_MAX, delay * 2)

    def _failed(self, reason: str, message: str) -> None:
        self.failures[reason] += 1
        self.up, self.problem = False, message
        log.debug("kubernetes API: %s", message)

    # -- requests -------------------------------------------------------------------------
    def _request(self, query: dict[str, str]) -> http.client.HTTPResponse:
        config = self.config
        assert isinstance(config, InCluster)
        try:
            with open(config.token_path, encoding="ascii") as f:
                token = f.read(16384).strip()
            context = ssl.create_default_context(cafile=config.ca_path)
        except (OSError, ValueError, ssl.SSLError) as exc:
            raise _Failure("unauthorized", "the service account's token or CA cannot be "
                           f"read ({exc}): is automountServiceAccountToken on?") from None
        selector = {"fieldSelector": f"spec.nodeName={config.node}"}
        path = "/api/v1/pods?" + urllib.parse.urlencode({**selector, **query})
        self._conn = http.client.HTTPSConnection(config.host, config.port, context=context,
                                                 timeout=self.timeout)
        self._conn.request("GET", path, headers={"Authorization": f"Bearer {token}",
                                                 "Accept": "application/json"})
        self._sock = self._conn.sock
        if self._stop.is_set():
            raise OSError("stopped")
        response = self._conn.getresponse()
        if response.status == 200:
            return response
        body = response.read(4096).decode("utf-8", "replace")
        if response.status == 410:
            raise _Gone()
        if response.status in (401, 403):
            reason = "unauthorized" if response.status == 401 else "forbidden"
            raise _Failure(reason, f"the API server refused to list pods ({response.status} "
                           f"{reason}): the chart's ClusterRole must allow get, list and "
                           f"watch on pods; {_message(body)}")
        raise _Failure("unavailable", f"the API server answered {response.status}: "
                       f"{_message(body)}")

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        sock, self._sock = self._sock, None
        if conn is not None:
            conn.close()
        if sock is not None:
            sock.close()

    def _list(self) -> None:
        pods: dict[tuple[str, str], PodMeta] = {}
        query = {"limit": "500"}
        while True:
            response = self._request(query)
            raw = response.read(MAX_LIST_BYTES + 1)
            if len(raw) > MAX_LIST_BYTES:
                raise _Failure("bad_response", "the pod list is larger than 64 MiB")
            try:
                answer = jsontext.loads(raw)
                items, meta = answer["items"], answer["metadata"]
            except (ValueError, KeyError, TypeError):
                raise _Failure("bad_response", "the pod list is not a PodList") from None
            for item in items if isinstance(items, list) else ():
                found = _pod(item)
                if found is not None and len(pods) < MAX_PODS:
                    pods[found[0]] = found[1]
            more = meta.get("continue") if isinstance(meta, dict) else None
            if not more:
                break
            query = {"limit": "500", "continue": str(more)}
            self._close()
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if not isinstance(version, str) or not version:
            raise _Failure("bad_response", "the pod list has no resourceVersion")
        with self._lock:
            self._pods = pods
        self._version = version
        self.synced = True

    def _watch(self) -> None:
        response = self._request({"watch": "1", "resourceVersion": self._version,
                                  "allowWatchBookmarks": "true",
                                  "timeoutSeconds": str(WATCH_SECONDS)})
        if self._sock is not None:
            self._sock.settimeout(WATCH_SECONDS + 30)  # the server ends it after 300 s
        while not self._stop.is_set():
            line = response.readline(MAX_LINE_BYTES + 1)
            if not line:
                return  # the server ended the watch
            if len(line) > MAX_LINE_BYTES or not line.endswith(b"\n"):
                raise _Failure("bad_response", "a watch event longer than 4 MiB")
            self._event(line)

    def _event(self, line: bytes) -> None:
        try:
            event = jsontext.loads(line)
            kind, item = event["type"], event["object"]
        except (ValueError, KeyError, TypeError):
            raise _Failure("bad_response", "a watch event that is not JSON") from None
        if kind == "ERROR":
            if isinstance(item, dict) and item.get("code") == 410:
                raise _Gone()
            raise _Failure("bad_response", f"the watch said: {_message(json.dumps(item))}")
        meta = item.get("metadata") if isinstance(item, dict) else None
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if kind != "BOOKMARK":
            found = _pod(item)
            if found is None:
                raise _Failure("bad_response", "a watch event without a pod")
            with self._lock:
                if kind == "DELETED":
                    if self._pods.get(found[0], found[1]).uid == found[1].uid:
                        self._pods.pop(found[0], None)
                elif found[0] in self._pods or len(self._pods) < MAX_PODS:
                    # one UID is one pod: under a new name, the old name is gone
                    for key in [k for k, m in self._pods.items()
                                if m.uid == found[1].uid and k != found[0]]:
                        del self._pods[key]
                    self._pods[found[0]] = found[1]
        if isinstance(version, str) and version:
            self._version = version


def _message(body: str) -> str:
    """The `message` of a Status answer, or the start of the body."""
    try:
        message = jsontext.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    text = message if isinstance(message, str) else body
    return " ".join(text.split())[:200]
