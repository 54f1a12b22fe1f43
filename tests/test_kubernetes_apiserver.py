"""Pod UIDs and labels from the API server: the watcher against a fake API server over
HTTPS on loopback (list then watch, a 403, a reset watch, 410 Gone, a pod replaced under
the same name), and the exporter serving gpu_pod_info{pod_uid} and gpu_pod_labels_info
beside the kubelet's attribution, which keeps working when the API server does not."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from exporter.collectors.kubernetes import apiserver
from exporter.collectors.kubernetes.apiserver import InCluster, PodWatcher, in_cluster
from exporter.collectors.kubernetes.reading import label_name
from exporter.sim.physics import gpu_uuid
from tests.certs import make_certs
from tests.fake_apiserver import FakeApiServer
from tests.tools import http_get, require_module, samples

require_module("grpc")
from tests.fake_kubelet import FakeKubelet, Holding  # noqa: E402

UUIDS = [gpu_uuid(1, i) for i in range(8)]


def eventually(check: Callable[[], object], what: str, seconds: float = 20.0) -> None:
    """Waits for a condition the watcher's thread brings about (no timing asserted)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def api(certs):
    server = FakeApiServer(certs.server_cert, certs.server_key).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def account(tmp_path, certs) -> Path:
    """A service account directory as the kubelet mounts it."""
    directory = tmp_path / "serviceaccount"
    directory.mkdir()
    (directory / "token").write_text("s3cret\n")
    (directory / "ca.crt").write_bytes(certs.ca.read_bytes())
    return directory


def config(api: FakeApiServer, account: Path) -> InCluster:
    found = in_cluster({"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                        "KUBERNETES_SERVICE_PORT": str(api.port), "NODE_NAME": "node-7"},
                       str(account))
    assert isinstance(found, InCluster)
    return found


@pytest.fixture
def watch(api, account):
    """A started watcher (retrying every 10 ms), stopped after the test."""
    stopped = threading.Event()
    watchers = []

    def start() -> PodWatcher:
        w = PodWatcher(config(api, account), timeout=5.0, sleep=lambda s: stopped.wait(0.01))
        watchers.append(w)
        return w.start()

    yield start
    stopped.set()
    for w in watchers:
        w.stop()


def uids(watcher: PodWatcher) -> dict[tuple[str, str], str]:
    return {key: meta.uid for key, meta in watcher.pods().items()}


def lists(api: FakeApiServer) -> int:
    return sum(1 for _, query, _ in api.requests if "watch" not in query)


def test_in_cluster_needs_the_service_and_the_node():
    assert "KUBERNETES_SERVICE_HOST" in in_cluster({})
    assert "NODE_NAME" in in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1",
                                      "KUBERNETES_SERVICE_PORT": "443"})
    found = in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443",
                        "NODE_NAME": "n1"})
    assert found == InCluster("10.0.0.1", 443, f"{apiserver.SERVICE_ACCOUNT_DIR}/token",
                              f"{apiserver.SERVICE_ACCOUNT_DIR}/ca.crt", "n1")


@pytest.mark.parametrize(("name", "label"), [
    ("team", "label_team"), ("app.kubernetes.io/name", "label_app_kubernetes_io_name"),
    ("batch.kubernetes.io/job-name", "label_batch_kubernetes_io_job_name")])
def test_label_names_are_written_as_kube_state_metrics_writes_them(name, label):
    assert label_name(name) == label


def test_lists_this_nodes_pods_then_follows_the_watch(api, watch):
    api.put("team-a", "llama-0", "uid-1", {"team": "nlp", "queue": "high"})
    api.put("team-b", "other", "uid-9", node="node-8")  # not this node
    watcher = watch()
    eventually(lambda: watcher.synced, "the first list")
    assert uids(watcher) == {("team-a", "llama-0"): "uid-1"}
    assert dict(watcher.pods()[("team-a", "llama-0")].labels) == {"team": "nlp", "queue": "high"}
    path, query, auth = api.requests[0]
    assert query["fieldSelector"] == ["spec.nodeName=node-7"] and auth == "Bearer s3cret"
    api.put("team-a", "llama-1", "uid-2")
    api.put("team-a", "llama-0", "uid-1", {"team": "nlp", "queue": "low"})  # relabelled
    eventually(lambda: len(watcher.pods()) == 2 and
               watcher.pods()[("team-a", "llama-0")].labels.get("queue") == "low",
               "the watch's events")
    assert lists(api) == 1 and watcher.up and watcher.problem == ""


def test_a_quiet_watch_outlives_the_request_timeout(api, account):
    """The request deadline is for connecting and answering; a watch with no event for
    longer stays open (the server ends it after timeoutSeconds)."""
    watcher = PodWatcher(config(api, account), timeout=0.2).start()
    try:
        eventually(lambda: watcher.synced and len(api.requests) >= 2, "a watch open")
        time.sleep(1.0)
        api.put("ml", "late", "uid-late")
        eventually(lambda: ("ml", "late") in watcher.pods(), "the late event")
        assert sum(watcher.failures.values()) == 0 and len(api.requests) == 2
    finally:
        watcher.stop()


def test_a_pod_replaced_under_the_same_name_gets_its_new_uid(api, watch):
    """A StatefulSet's pod, restarted: deleted, then created again with its name; and a
    UID that shows under a new name."""
    api.put("ml", "trainer-0", "uid-old", {"job": "a"})
    watcher = watch()
    eventually(lambda: watcher.synced, "the first list")
    api.delete("ml", "trainer-0")
    eventually(lambda: ("ml", "trainer-0") not in watcher.pods(), "the deletion")
    api.put("ml", "trainer-0", "uid-new", {"job": "b"})
    eventually(lambda: uids(watcher).get(("ml", "trainer-0")) == "uid-new", "the new pod")
    assert dict(watcher.pods()[("ml", "trainer-0")].labels) == {"job": "b"}
    # a late DELETED of the old pod must not remove the new one of the same name
    watcher._event(b'{"type": "DELETED", "object": {"metadata": {"name": "trainer-0", '
                   b'"namespace": "ml", "uid": "uid-old"}}}\n')
    assert uids(watcher)[("ml", "trainer-0")] == "uid-new"
    # the same UID under another name (a renamed pod): the old name is forgotten
    watcher._event(b'{"type": "MODIFIED", "object": {"metadata": {"name": "trainer-renamed", '
                   b'"namespace": "ml", "uid": "uid-new", "labels": {"job": "c"}}}}\n')
    assert uids(watcher) == {("ml", "trainer-renamed"): "uid-new"}


def test_a_reset_watch_is_resumed_from_the_last_version(api, watch):
    api.put("ml", "a", "uid-a")
    watcher = watch()
    eventually(lambda: watcher.synced and watcher.watches == 0 and len(api.requests) >= 2,
               "a watch open")
    api.put("ml", "b", "uid-b")
    eventually(lambda: ("ml", "b") in watcher.pods(), "b")
    seen = api.version
    with api.lock:
        api.reset_watches = True
        api.lock.notify_all()
    eventually(lambda: watcher.watches + sum(watcher.failures.values()) >= 1,
               "the reset noticed")
    api.reset_watches = False
    api.put("ml", "c", "uid-c")
    eventually(lambda: ("ml", "c") in watcher.pods(), "c, after the reset")
    assert lists(api) == 1  # resumed, not listed again
    resumed = [q for _, q, _ in api.requests if "watch" in q][-1]
    assert int(resumed["resourceVersion"][0]) >= seen


def test_a_version_too_old_lists_again(api, watch):
    api.put("ml", "a", "uid-a")
    watcher = watch()
    eventually(lambda: watcher.synced and len(api.requests) >= 2, "a watch open")
    api.compact()
    with api.lock:
        api.reset_watches = True
        api.lock.notify_all()
    # the open watch is reset, or (if the server had not got to it yet) told 410 at once
    eventually(lambda: watcher.failures["gone"] >= 1 and lists(api) >= 2, "a fresh list")
    api.reset_watches = False
    api.put("ml", "b", "uid-b")
    eventually(lambda: ("ml", "b") in watcher.pods(), "b after the relist")


def test_forbidden_says_why_keeps_what_it_knew_and_recovers(api, watch):
    api.forbidden = True
    watcher = watch()
    eventually(lambda: watcher.failures["forbidden"] >= 2, "retries with back-off")
    assert not watcher.up and not watcher.synced
    assert "403 forbidden" in watcher.problem and "cannot list" in watcher.problem
    api.forbidden = False
    api.put("ml", "a", "uid-a")
    eventually(lambda: watcher.up and ("ml", "a") in watcher.pods(), "recovery")
    assert watcher.problem == ""


def test_a_wrong_token_is_unauthorized(api, watch, account):
    (account / "token").write_text("wrong\n")
    watcher = watch()
    eventually(lambda: watcher.failures["unauthorized"] >= 1, "a 401")
    assert "401" in watcher.problem
    (account / "token").write_text("s3cret\n")  # a rotated token is read again
    eventually(lambda: watcher.synced, "the list with the new token")


def test_garbage_from_the_api_server_is_refused(watch, api):
    watcher = watch()
    eventually(lambda: watcher.synced, "the first list")
    for line in (b"not json\n", b'{"type": "ADDED"}\n', b'{"type": "ADDED", "object": 3}\n',
                 b'{"type": "ERROR", "object": {"code": 500}}\n',
                 b"[" * 5000 + b"\n"):  # nested past the decoder's stack: refused too
        with pytest.raises(apiserver._Failure):
            watcher._event(line)
    with pytest.raises(apiserver._Gone):
        watcher._event(b'{"type": "ERROR", "object": {"code": 410}}\n')


# --------------------------------------------------------------- through the exporter

def pod_series(found: dict) -> set[tuple[str, ...]]:
    return {(s.labels["gpu"], s.labels["namespace"], s.labels["pod"], s.labels["pod_uid"])
            for s in found.get("gpu_pod_info", [])}


def test_the_exporter_serves_uids_and_labels_and_degrades_without_the_api(
        running_exporter, api, account, tmp_path, monkeypatch):
    monkeypatch.setattr(apiserver, "SERVICE_ACCOUNT_DIR", str(account))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
    monkeypatch.setenv("NODE_NAME", "node-7")
    api.put("team-a", "llama-0", "uid-1", {"team": "nlp", "queue": "high", "secret": "x",
                                           "app.kubernetes.io/name": "llama"})
    path = str(tmp_path / "k.sock")
    kubelet = FakeKubelet(path, [
        Holding("team-a", "llama-0", "trainer", "nvidia.com/gpu", (UUIDS[0], UUIDS[1])),
        Holding("team-b", "bert-7", "worker", "nvidia.com/gpu", (UUIDS[5],))]).start()
    try:
        exp = running_exporter.start(manual=True, kubernetes_pod_resources_socket=path,
                                     kubernetes_pod_labels=r"team|queue|app\.kubernetes\.io/.*")

        def scrape() -> dict:
            exp.sampler.advance(5)
            return samples(http_get(exp.port)[1])

        found: dict = {}

        def served() -> bool:
            found.update(scrape())
            return ("0", "team-a", "llama-0", "uid-1") in pod_series(found)

        eventually(served, "the UID on gpu_pod_info")
        assert pod_series(found) == {("0", "team-a", "llama-0", "uid-1"),
                                     ("1", "team-a", "llama-0", "uid-1"),
                                     ("5", "team-b", "bert-7", "")}  # not known to the API
        labels = [s.labels for s in found["gpu_pod_labels_info"]]
        assert labels == [{"namespace": "team-a", "pod": "llama-0", "pod_uid": "uid-1",
                           "label_team": "nlp", "label_queue": "high",
                           "label_app_kubernetes_io_name": "llama"}]
        assert found["cte_kubernetes_api_up"][0].value == 1.0
        assert http_get(exp.port, "/readyz")[1].decode().startswith("ok")
        # the API server refuses: the kubelet's attribution goes on, /readyz says why
        api.forbidden = True
        with api.lock:
            api.reset_watches = True
            api.lock.notify_all()

        def degraded() -> bool:
            found.clear()
            found.update(scrape())
            return found["cte_kubernetes_api_up"][0].value == 0.0

        eventually(degraded, "the API server's failure seen")
        api.reset_watches = False
        ready = http_get(exp.port, "/readyz")[1].decode()
        assert ready.startswith("degraded") and "403 forbidden" in ready
        assert re.search(r"pod UIDs and labels from the API server", ready)
        assert ("5", "team-b", "bert-7", "") in pod_series(found)
        assert ("0", "team-a", "llama-0", "uid-1") in pod_series(found)  # still known
        failures = {s.labels["reason"]: s.value
                    for s in found["cte_kubernetes_api_failures_total"]}
        assert failures["forbidden"] >= 1
    finally:
        kubelet.stop()


def test_without_pod_labels_nothing_is_asked_and_pod_uid_is_empty(running_exporter,
                                                                   tmp_path):
    path = str(tmp_path / "k.sock")
    kubelet = FakeKubelet(path, [Holding("a", "p", "c", "nvidia.com/gpu", (UUIDS[2],))]).start()
    try:
        exp = running_exporter.start(manual=True, kubernetes_pod_resources_socket=path)
        exp.sampler.advance(5)
        found = samples(http_get(exp.port)[1])
        assert pod_series(found) == {("2", "a", "p", "")}
        assert "gpu_pod_labels_info" not in found and "cte_kubernetes_api_up" not in found
    finally:
        kubelet.stop()


def test_only_whole_matching_names_are_copied_and_at_most_32():
    from types import MappingProxyType

    from exporter.collectors.kubernetes.apiserver import PodMeta
    from exporter.collectors.kubernetes.reading import KubernetesCollector, PodDevice
    from exporter.sampling.collector_api import CollectorContext

    labels = {f"team-{i:02d}": str(i) for i in range(40)}
    labels |= {"xteam": "no", "team": "yes", "a.b/team": "yes", "a-b/team": "clash"}
    known = {("ns", "p"): PodMeta("u1", MappingProxyType(labels))}
    collector = KubernetesCollector("/nonexistent", CollectorContext(),
                                    pod_labels=re.compile(r"team(-\d+)?|a[.-]b/team"))
    got = collector._labels((PodDevice(0, "GPU-x", None, "ns", "p", "c"),
                             PodDevice(1, "GPU-y", None, "ns", "gone", "c")), known)
    assert len(got) == 1 and (got[0].namespace, got[0].pod, got[0].pod_uid) == ("ns", "p", "u1")
    names = dict(got[0].labels)
    assert len(names) == 32 and "label_xteam" not in names
    # two names that write the same label: the first in name order is kept
    assert names["label_a_b_team"] == "clash"
