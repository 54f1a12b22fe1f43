"""Pods holding GPUs, from a fake kubelet (a real gRPC server on a unix socket): the
decoder against protobuf's own encoding, a kubelet that starts late, restarts, answers
garbage or nothing, a socket that is a file, MIG device ids, and no gRPC at all."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import threading

import pytest

from exporter.collectors.kubernetes import reading as k8s
from exporter.collectors.kubernetes import spec as k8s_spec
from exporter.collectors.kubernetes.podresources import BadMessage, parse_list_response
from exporter.collectors.kubernetes.reading import KubernetesCollector, KubernetesReading, PodDevice
from exporter.config import Config
from exporter.sampling.collector_api import CollectorContext
from exporter.sim.physics import gpu_uuid
from exporter.sim.scenarios import load_scenario
from exporter.sim.tenants import mig_uuid
from tests.tools import http_get, require_module, samples

grpc = require_module("grpc")
require_module("google.protobuf")
from tests.fake_kubelet import FakeKubelet, Holding, encode  # noqa: E402

UUIDS = [gpu_uuid(1, i) for i in range(8)]  # the fake's GPUs (seed 1)

# ---------------------------------------------------------------- the decoder


def test_decodes_what_protobuf_encodes():
    raw = encode([Holding("team-a", "train-0", "trainer", "nvidia.com/gpu", (UUIDS[0],)),
                  Holding("team-a", "train-0", "sidecar", "example.com/nic", ("eth1",)),
                  Holding("team-b", "nb", "jupyter", "nvidia.com/mig-1g.18gb", ("MIG-a", "MIG-b"))])
    got = [(e.namespace, e.pod, e.container, e.resource_name, e.device_ids)
           for e in parse_list_response(raw)]
    assert got == [("team-a", "train-0", "trainer", "nvidia.com/gpu", (UUIDS[0],)),
                   ("team-a", "train-0", "sidecar", "example.com/nic", ("eth1",)),
                   ("team-b", "nb", "jupyter", "nvidia.com/mig-1g.18gb", ("MIG-a", "MIG-b"))]
    assert parse_list_response(b"") == []


@pytest.mark.parametrize("raw", [
    b"\x0a\x05abc",  # truncated
    b"\x0a\x02\x0a\x80",  # a truncated varint inside
    b"\x0b\x0c",  # a group (wire type 3)
    b"\x0e",  # wire type 6
    b"\x02\x00",  # field number 0
    b"\x0a\x04\x12\x02\xff\xfe",  # a namespace that is not UTF-8
    b"\x08\x01",  # pod_resources as a number
    b"\x0a\x02\x10\x01",  # a namespace as a number
    b"\x0a" + b"\xff" * 11,  # a varint over 10 bytes
])
def test_garbage_is_one_bad_message(raw):
    with pytest.raises(BadMessage):
        parse_list_response(raw)


def test_random_bytes_never_raise_anything_else():
    rng = random.Random(14)
    good = encode([Holding("a", "b", "c", "nvidia.com/gpu", (UUIDS[1],))])
    for _ in range(3000):
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        if rng.random() < 0.5:  # mutations of a real answer reach deeper
            raw = bytearray(good)
            raw[rng.randrange(len(raw))] = rng.randrange(256)
            raw = bytes(raw[:rng.randrange(1, len(raw) + 1)])
        with contextlib.suppress(BadMessage):
            parse_list_response(raw)


# ---------------------------------------------------------------- a running exporter


def pods(exp) -> set[tuple[str, ...]]:
    got = samples(http_get(exp.port)[1])
    return {(s.labels["gpu"], s.labels["uuid"], s.labels["namespace"], s.labels["pod"],
             s.labels["container"], s.labels["gpu_instance"])
            for s in got.get("gpu_pod_info", [])}


def figures(exp) -> dict[str, object]:
    got = samples(http_get(exp.port)[1])
    return {"up": got["cte_kubernetes_pod_resources_up"][0].value,
            "failures": {s.labels["reason"]: s.value
                         for s in got["cte_kubernetes_pod_resources_failures_total"]},
            "unmatched": got["cte_kubernetes_devices_unmatched"][0].value}


TWO_PODS = [
    Holding("team-a", "llama-0", "trainer", "nvidia.com/gpu", (UUIDS[0], UUIDS[1])),
    Holding("team-b", "bert-7", "worker", "nvidia.com/gpu", (UUIDS[5],)),
    Holding("team-b", "bert-7", "worker", "example.com/fpga", ("fpga-0",)),
]


def test_a_kubelet_that_starts_late_then_restarts(running_exporter, tmp_path):
    path = str(tmp_path / "kubelet.sock")
    exp = running_exporter.start(manual=True, kubernetes_pod_resources_socket=path)
    exp.sampler.advance(5)
    assert pods(exp) == set() and figures(exp)["failures"]["absent"] >= 1
    kubelet = FakeKubelet(path, TWO_PODS).start()  # after the exporter, as the issue asks
    try:
        exp.sampler.advance(5)
        assert pods(exp) == {
            ("0", UUIDS[0], "team-a", "llama-0", "trainer", ""),
            ("1", UUIDS[1], "team-a", "llama-0", "trainer", ""),
            ("5", UUIDS[5], "team-b", "bert-7", "worker", "")}
        assert figures(exp)["up"] == 1.0 and figures(exp)["unmatched"] == 0
        assert exp.sampler.job_groups()[5] == "team-b/bert-7"
        kubelet.stop()  # a kubelet restart: the socket is gone for a while
        exp.sampler.advance(10)
        assert len(pods(exp)) == 3  # the last answer is served meanwhile
        assert figures(exp)["up"] == 0.0 and figures(exp)["failures"]["absent"] >= 2
        kubelet.holdings = [Holding("team-c", "new-1", "main", "nvidia.com/gpu",
                                    (UUIDS[2],))]
        kubelet.start()  # back, a new socket file
        exp.sampler.advance(5)
        assert pods(exp) == {("2", UUIDS[2], "team-c", "new-1", "main", "")}
        kubelet.stop()
        exp.sampler.advance(k8s.KEEP_SECONDS + 10)
        assert pods(exp) == set()  # too old to trust
    finally:
        kubelet.stop()


def test_gke_dra_and_time_sliced_allocations(running_exporter, tmp_path):
    """GKE's `nvidiaN` (N the minor number, not NVML's index: the fake swaps them in
    pairs), its `/vgpuK` time-sharing, NVIDIA's time-slicing `::K`, and devices allocated
    through NVIDIA's DRA driver, by `gpu-<minor>` or by UUID."""
    path = str(tmp_path / "k.sock")
    kubelet = FakeKubelet(path, [
        Holding("gke", "a", "main", "nvidia.com/gpu", ("nvidia0",)),
        Holding("gke", "b", "main", "nvidia.com/gpu", ("nvidia3/vgpu2", "nvidia3/vgpu5")),
        Holding("ts", "c", "main", "nvidia.com/gpu", (f"{UUIDS[7]}::1",)),
        Holding("ts", "d", "main", "nvidia.com/gpu", (f"{UUIDS[7]}::4",)),
        Holding("dra", "e", "main", "gpu.nvidia.com", ("gpu-4", "gpu-5"), dra=True),
        Holding("dra", "f", "main", "gpu.nvidia.com", (UUIDS[6],), dra=True),
        Holding("dra", "nic", "main", "nic.example.com", ("eth0",), dra=True),  # not ours
        Holding("gke", "ghost", "main", "nvidia.com/gpu", ("nvidia9",)),  # no such device
        Holding("dra", "mig", "main", "gpu.nvidia.com", ("gpu-0-mig-9-0-1",), dra=True),
    ]).start()
    try:
        exp = running_exporter.start(manual=True, kubernetes_pod_resources_socket=path)
        exp.sampler.advance(5)
        assert pods(exp) == {
            ("1", UUIDS[1], "gke", "a", "main", ""), ("2", UUIDS[2], "gke", "b", "main", ""),
            ("7", UUIDS[7], "ts", "c", "main", ""), ("7", UUIDS[7], "ts", "d", "main", ""),
            ("5", UUIDS[5], "dra", "e", "main", ""), ("4", UUIDS[4], "dra", "e", "main", ""),
            ("6", UUIDS[6], "dra", "f", "main", "")}
        assert figures(exp)["unmatched"] == 2  # nvidia9, the MIG device from DRA
    finally:
        kubelet.stop()


def test_decodes_dynamic_resources_as_protobuf_encodes_them():
    raw = encode([Holding("a", "p", "c", "nvidia.com/gpu", (UUIDS[0],)),
                  Holding("a", "p", "d", "gpu.nvidia.com", ("gpu-1", "gpu-2"), dra=True)])
    got = [(e.container, e.resource_name, e.device_ids, e.dynamic)
           for e in parse_list_response(raw)]
    assert got == [("c", "nvidia.com/gpu", (UUIDS[0],), False),
                   ("d", "gpu.nvidia.com", ("gpu-1",), True),
                   ("d", "gpu.nvidia.com", ("gpu-2",), True)]
    # a claim resource given as a number is garbage, as elsewhere
    with pytest.raises(BadMessage):
        parse_list_response(b"\x0a\x04\x1a\x02\x28\x01")


def readyz(exp) -> str:
    return http_get(exp.port, "/readyz")[1].decode()


def test_readyz_says_why_attribution_cannot_work(running_exporter, tmp_path):
    path = str(tmp_path / "kubelet.sock")
    exp = running_exporter.start(manual=True, kubernetes_pod_resources_socket=path)
    exp.sampler.advance(5)
    body = readyz(exp)
    assert body.startswith("degraded\n") and "collector kubernetes cannot work" in body
    assert f"{path} does not exist" in body
    kubelet = FakeKubelet(path, TWO_PODS).start()
    try:
        exp.sampler.advance(5)
        assert readyz(exp) == "ok\n"  # working again: nothing listed
    finally:
        kubelet.stop()


def test_readyz_degraded_without_grpc(running_exporter, tmp_path, monkeypatch):
    monkeypatch.setattr(k8s, "import_grpc", lambda: None)  # read when the collector is made
    exp = running_exporter.start(manual=True,
                                 kubernetes_pod_resources_socket=str(tmp_path / "k.sock"))
    exp.sampler.advance(5)
    body = readyz(exp)
    assert body.startswith("degraded\n") and "grpcio package is missing" in body


def test_a_socket_without_permission_says_so(tmp_path, monkeypatch):
    path = tmp_path / "k.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.close()  # a socket file nobody listens on: refused, as without permission
    monkeypatch.setattr(k8s.os, "access", lambda p, mode: False)
    source = KubernetesCollector(str(path), context(), timeout=1.0, grpc=grpc)
    try:
        reading = source.read()
    finally:
        source.close()
    assert not reading.up and "no permission to connect" in reading.problem


def test_mig_devices_and_device_id_forms(running_exporter, tmp_path):
    scenario = load_scenario("mig")
    gi = {(m.gpu_instance): m for m in scenario.mig[0].instances}
    path = str(tmp_path / "k.sock")
    kubelet = FakeKubelet(path, [
        Holding("ml", "ft", "main", "nvidia.com/mig-3g.71gb", (mig_uuid(1, 0, gi[1]),)),
        Holding("ml", "nb", "main", "nvidia.com/mig-1g.18gb", ("0:2",)),  # index strategy
        Holding("ml", "old", "main", "nvidia.com/mig-2g.35gb", (f"MIG-{UUIDS[0]}/5/0",)),
        Holding("ml", "ts", "main", "nvidia.com/gpu.shared", (f"{UUIDS[3]}::2", "4")),
        Holding("ml", "ghost", "main", "nvidia.com/gpu", ("GPU-nope", "MIG-nope", "9", "0:6")),
        # GKE: /dev/nvidia1 is GPU 0 on the fake (minor numbers swapped in pairs), GPU
        # instance 1, time-shared; an instance GPU 0 does not have
        Holding("ml", "gke", "main", "nvidia.com/mig-3g.71gb", ("nvidia1/gi1/vgpu3",)),
        Holding("ml", "gke-ghost", "main", "nvidia.com/mig-1g.18gb", ("nvidia1/gi99",)),
        Holding("ml", "bad\nname", "main", "nvidia.com/gpu", (UUIDS[6],)),
    ]).start()
    try:
        exp = running_exporter.start(manual=True, scenario="mig",
                                     kubernetes_pod_resources_socket=path)
        exp.sampler.advance(5)
        assert pods(exp) == {
            ("0", UUIDS[0], "ml", "ft", "main", "1"), ("0", UUIDS[0], "ml", "nb", "main", "13"),
            ("0", UUIDS[0], "ml", "old", "main", "5"), ("3", UUIDS[3], "ml", "ts", "main", ""),
            ("4", UUIDS[4], "ml", "ts", "main", ""), ("0", UUIDS[0], "ml", "gke", "main", "1")}
        assert figures(exp)["unmatched"] == 6
    finally:
        kubelet.stop()


def test_dra_mig_devices_are_matched_by_their_placement(running_exporter, tmp_path):
    """NVIDIA's DRA driver names a MIG device by its parent's minor number and the GPU
    instance's placement, in the forms its releases used. On the fake, /dev/nvidia1 is
    GPU 0 and /dev/nvidia0 GPU 1; GPU 0's instances 1, 5, 13, 14 (3g, 2g, 1g, 1g) sit at
    memory slices 0-3, 4-5, 6 and 7 (profile ids 9, 14, 19, 19), GPU 1's two 3g at 0-3
    and 4-7."""
    path = str(tmp_path / "k.sock")
    dra = "gpu.nvidia.com"
    kubelet = FakeKubelet(path, [
        Holding("ml", "classic", "main", dra, ("gpu-1-mig-9-0-4",), dra=True),
        Holding("ml", "range", "main", dra, ("gpu-1-mig-2g35gb-4-5",), dra=True),
        Holding("ml", "single", "main", dra, ("gpu-1-mig-1g18gb-6",), dra=True),
        Holding("ml", "by-id", "main", dra, ("gpu-0-mig-3g71gb-9-4",), dra=True),
        Holding("ml", "whole", "main", dra, ("gpu-3",), dra=True),
        # no instance at slice 3 of GPU 0; no GPU with minor 9; a classic name short of
        # its size; a malformed name
        Holding("ml", "ghost", "main", dra, ("gpu-1-mig-19-3-1", "gpu-9-mig-9-0-4",
                                             "gpu-1-mig-9-0", "gpu-1-mig-"), dra=True),
    ]).start()
    try:
        exp = running_exporter.start(manual=True, scenario="mig",
                                     kubernetes_pod_resources_socket=path)
        exp.sampler.advance(5)
        assert pods(exp) == {
            ("0", UUIDS[0], "ml", "classic", "main", "1"),
            ("0", UUIDS[0], "ml", "range", "main", "5"),
            ("0", UUIDS[0], "ml", "single", "main", "13"),
            ("1", UUIDS[1], "ml", "by-id", "main", "2"),
            ("2", UUIDS[2], "ml", "whole", "main", "")}
        assert figures(exp)["unmatched"] == 4
    finally:
        kubelet.stop()


def test_a_socket_that_is_a_regular_file_is_never_dialled(running_exporter, tmp_path):
    path = tmp_path / "kubelet.sock"
    path.write_text("not a socket")
    exp = running_exporter.start(manual=True, kubernetes_pod_resources_socket=str(path))
    exp.sampler.advance(10)
    got = figures(exp)
    assert got["up"] == 0.0 and got["failures"]["not_a_socket"] >= 2
    assert pods(exp) == set()


def test_garbage_from_the_kubelet_is_refused(running_exporter, tmp_path):
    path = str(tmp_path / "k.sock")
    kubelet = FakeKubelet(path, TWO_PODS).start()
    try:
        exp = running_exporter.start(manual=True, kubernetes_pod_resources_socket=path)
        exp.sampler.advance(1)
        assert len(pods(exp)) == 3
        kubelet.raw = b"\x0a\x05\xff\xff"
        exp.sampler.advance(5)
        assert figures(exp)["failures"]["bad_response"] >= 1
        assert len(pods(exp)) == 3  # the last good answer still stands
    finally:
        kubelet.stop()


def context(gpus: int = 8) -> CollectorContext:
    from exporter.gpu.reading import GpuIdentity

    identities = [GpuIdentity(i, UUIDS[i], "H100", "", "") for i in range(gpus)]
    return CollectorContext(gpu_count=gpus, identities=lambda: identities)


def test_a_socket_that_never_answers_times_out(tmp_path):
    path = str(tmp_path / "mute.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_hold() -> None:  # takes connections, says nothing
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept_and_hold, daemon=True)
    thread.start()
    source = KubernetesCollector(path, context(), timeout=0.3, grpc=grpc)
    try:
        reading = source.read()
        assert not reading.up and reading.failures_total["timeout"] == 1
    finally:
        source.close()
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


def test_without_grpc_one_line_and_a_figure(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        source = KubernetesCollector(str(tmp_path / "k.sock"), context(), grpc=None)
        first, second = source.read(), source.read()
    assert [r.getMessage() for r in caplog.records if "grpcio" in r.getMessage()] != []
    assert len(caplog.records) == 1 and caplog.records[0].exc_info is None
    assert not second.up and second.failures_total["no_grpc"] == 2 and first.devices == ()
    assert "grpcio" in second.problem


def test_series_are_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(k8s, "MAX_SERIES", 2)
    path = str(tmp_path / "k.sock")
    kubelet = FakeKubelet(path, [Holding("n", f"p{i}", "c", "nvidia.com/gpu", (UUIDS[i],))
                                 for i in range(5)]).start()
    source = KubernetesCollector(path, context(), grpc=grpc)
    try:
        reading = source.read()
        assert [d.gpu for d in reading.devices] == [0, 1] and reading.dropped_total == 3
    finally:
        source.close()
        kubelet.stop()


def test_peer_groups_are_whole_gpus_held_by_one_pod():
    reading = KubernetesReading(devices=(
        PodDevice(0, "u0", None, "a", "p", "c1"), PodDevice(0, "u0", None, "a", "p", "c2"),
        PodDevice(1, "u1", None, "a", "p", "c"), PodDevice(1, "u1", None, "b", "q", "c"),
        PodDevice(2, "u2", 3, "a", "p", "c")), up=True)
    assert reading.gpu_groups() == {0: "a/p"}


def test_on_by_default_only_with_a_socket(tmp_path, monkeypatch):
    spec = k8s_spec.SPEC
    assert not spec.enabled(Config.of().collectors)  # no kubelet socket on this machine
    assert spec.enabled(Config.of(kubernetes_pod_resources_socket="/run/later.sock").collectors)
    assert not spec.enabled(Config.of(kubernetes_pod_resources_socket="/x",
                                      collector_kubernetes=False).collectors)
    present = tmp_path / "kubelet.sock"
    present.write_text("")
    monkeypatch.setattr(k8s_spec, "DEFAULT_SOCKET", str(present))
    assert spec.enabled(Config.of().collectors)
    assert os.path.exists(present)


def test_pods_without_the_resource_prefix_are_skipped_undecoded():
    raw = encode([Holding("a", "gpu", "c", "nvidia.com/gpu", (UUIDS[0],)),
                  Holding("b", "cpu-only", "c", "example.com/nic", ("eth0",))])
    assert [e.pod for e in parse_list_response(raw, b"nvidia.com")] == ["gpu"]
    assert [e.pod for e in parse_list_response(raw)] == ["gpu", "cpu-only"]
