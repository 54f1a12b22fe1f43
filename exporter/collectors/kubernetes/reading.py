"""Which Kubernetes pod (and container) holds which GPU or MIG device, from the kubelet's
pod-resources API: gRPC `v1.PodResourcesLister/List` over its unix socket.

The device plugin's device ids name the devices: GPU UUIDs (`nvidia.com/gpu`), MIG
UUIDs (`nvidia.com/mig-<profile>`, or the old `MIG-GPU-<uuid>/<gi>/<ci>` form), with
a `::N` replica suffix under time-slicing; with the plugin's index strategy, `N` (GPU N)
and `N:M` (GPU N's M-th MIG device). GKE's plugin names a GPU by its device file,
`nvidiaN` for `/dev/nvidiaN` (N is the driver's minor number, which need not be NVML's
index), a MIG instance `nvidiaN/giM` (GPU instance M), with a `/vgpuK` suffix under GKE's
time-sharing. Any resource named `nvidia.com/...` is taken. Devices allocated through
DRA (a ResourceClaim) come as a driver and a device name: NVIDIA's driver
(`gpu.nvidia.com`, the only DRA driver taken) names a GPU `gpu-N`, N the minor number
again (a UUID as the device's name is matched too), and a MIG device by its parent's minor
number and its placement, in one of the forms its releases have used
(k8s-dra-driver-gpu, `MigDeviceInfo.CanonicalName`):

- `gpu-N-mig-PROFILEID-START-SIZE` (`gpu-0-mig-9-0-4`: profile id 9, memory slices 0-3);
- `gpu-N-mig-PROFILE-START` or `gpu-N-mig-PROFILE-START-END` (dynamic MIG: the profile
  name without its dot, `gpu-0-mig-1g18gb-6`, `gpu-0-mig-3g71gb-0-3`);
- `gpu-N-mig-PROFILE-PROFILEID-START` (`gpu-0-mig-3g71gb-9-0`).

Each GPU instance's profile id and placement come from NVML (`nvmlGpuInstanceGetInfo`,
read only when such a name is to be matched); a name that fits exactly one instance names
it. Ids that match no GPU or instance here are counted (`cte_kubernetes_devices_unmatched`).

Robustness, because the kubelet restarts (its socket vanishes and comes back, a new
file) and because whatever answers on that socket is not ours:
- every read is one call with a deadline (`--kubernetes.timeout`, 2 s), on the
  collector's own loop: a scrape never waits for the kubelet;
- before dialling, the path must be a socket (a missing path is `absent`, a regular file
  `not_a_socket`: nothing is dialled); the channel is made afresh after a failure and
  when the socket file is a new one, so a restarted kubelet is found at the next read;
- failures are counted by reason (`cte_kubernetes_pod_resources_failures_total`) and the
  last answer is served for :data:`KEEP_SECONDS` more (pods outlive a kubelet restart),
  then dropped;
- the answer is decoded by hand (:mod:`exporter.collectors.kubernetes.podresources`), bounded to
  16 MiB, and at most :data:`MAX_SERIES` pod-device series are kept (the rest counted).

With ``--kubernetes.pod-labels REGEX``, the pods of this node are also read from the API
server (:mod:`exporter.collectors.kubernetes.apiserver`): each device's pod gets its UID
(``pod_uid``), and the labels whose names match REGEX (the whole name) are kept for
``gpu_pod_labels_info``. The API server failing never stops the kubelet's attribution:
``pod_uid`` is then empty for pods not yet seen, and the reading's problem says why.

gRPC is an optional dependency (the `kubernetes` extra, or `pip install grpcio`): without
it the collector logs one line, counts `no_grpc` and serves nothing. Whenever the
collector is on but cannot read the kubelet (no grpcio, no socket, no answer, no
permission), its reading says why, and `/readyz` lists it as degraded.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from exporter.collectors.kubernetes.apiserver import PodMeta, PodWatcher
from exporter.collectors.kubernetes.podresources import (
    BadMessage,
    ContainerDevices,
    parse_list_response,
)
from exporter.collectors.mig.reading import Placement, read_mig_devices, read_placements
from exporter.sampling.collector_api import CollectorContext, HoldsResources, JobGrouping

__all__ = ["FAILURE_REASONS", "KEEP_SECONDS", "MAX_SERIES",
           "KubernetesReading", "KubernetesCollector", "PodDevice", "PodLabels",
           "label_name"]

log = logging.getLogger(__name__)

NO_GRPC = ("the grpcio package is missing, so gpu_pod_info stays empty (install the "
           "exporter with its kubernetes extra, or pip install grpcio)")

LIST_METHOD = "/v1.PodResourcesLister/List"
#: Why a List failed (the self-metric's `reason` label).
FAILURE_REASONS = ("absent", "not_a_socket", "unavailable", "timeout", "error",
                   "bad_response", "no_grpc")
#: How long the last answer is served while the kubelet does not answer.
KEEP_SECONDS = 120.0
#: gpu_pod_info series kept per answer at most.
MAX_SERIES = 1024
#: Largest answer accepted (the kubelet's own limit for this API).
MAX_MESSAGE_BYTES = 16 << 20
#: Longest namespace, pod or container name accepted (Kubernetes allows 253).
MAX_NAME_CHARS = 253
RESOURCE_PREFIX = "nvidia.com/"
#: NVIDIA's DRA driver, whose devices are named `gpu-<minor>`.
DRA_DRIVER = "gpu.nvidia.com"

_OLD_MIG = re.compile(r"MIG-(GPU-[0-9a-fA-F-]+)/([0-9]+)/([0-9]+)\Z")
_INDEX = re.compile(r"([0-9]{1,4})(?::([0-9]{1,2}))?\Z")
_GKE = re.compile(r"nvidia([0-9]{1,4})(?:/gi([0-9]{1,3}))?(?:/vgpu[0-9]{1,4})?\Z")
#: Pod labels copied per pod at most.
MAX_POD_LABELS = 32
_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")
_DRA_GPU = re.compile(r"gpu-([0-9]{1,4})\Z")
_DRA_MIG = re.compile(r"gpu-([0-9]{1,4})-mig-([a-z0-9]{1,32}(?:-[0-9]{1,3}){1,3})\Z")


@dataclass(frozen=True)
class PodDevice:
    gpu: int
    uuid: str  # the GPU's (a MIG device's parent's)
    gpu_instance: int | None  # None: the whole GPU
    namespace: str
    pod: str
    container: str
    pod_uid: str = ""  # from the API server; "" while the pod is not known there


@dataclass(frozen=True)
class PodLabels:
    namespace: str
    pod: str
    pod_uid: str
    labels: tuple[tuple[str, str], ...]  # (Prometheus label name, value), sorted


def label_name(name: str) -> str:
    """A pod label's name as a Prometheus label, as kube-state-metrics writes it:
    `app.kubernetes.io/team` -> `label_app_kubernetes_io_team`."""
    return "label_" + _LABEL_CHARS.sub("_", name)


@dataclass(frozen=True)
class KubernetesReading(JobGrouping):
    devices: tuple[PodDevice, ...]  # the last answer's (kept KEEP_SECONDS after it)
    up: bool  # the last List succeeded
    failures_total: Mapping[str, int] = field(default_factory=dict)
    last_success: float = 0.0  # epoch seconds, 0: never
    unmatched: int = 0  # device ids in the last answer that name no device here
    dropped_total: int = 0  # series left out past MAX_SERIES, over every answer
    problem: str = ""  # why the last read failed, for /readyz ("" when it worked)
    pod_labels: tuple[PodLabels, ...] = ()  # pods holding devices here, with --pod-labels
    api_up: bool | None = None  # the API server's last call worked; None: not asked
    api_failures_total: Mapping[str, int] = field(default_factory=dict)

    def gpu_groups(self) -> dict[int, str]:
        """GPU -> namespace/pod, for whole GPUs held by exactly one pod (peer groups for
        the straggler analysis)."""
        pods: dict[int, set[str]] = {}
        for d in self.devices:
            if d.gpu_instance is None:
                pods.setdefault(d.gpu, set()).add(f"{d.namespace}/{d.pod}")
        return {gpu: next(iter(names)) for gpu, names in pods.items() if len(names) == 1}


def import_grpc() -> Any:
    try:
        import grpc
    except ImportError:
        return None
    return grpc


def _wanted(entry: ContainerDevices) -> bool:
    """An NVIDIA device plugin's resource or NVIDIA's DRA driver's device (other DRA
    drivers' devices, NICs and the like, are not ours)."""
    if entry.dynamic:
        return entry.resource_name == DRA_DRIVER
    return entry.resource_name.startswith(RESOURCE_PREFIX)


def _usable_name(text: str) -> bool:
    return 0 < len(text) <= MAX_NAME_CHARS and text.isprintable()


class _Devices:
    """Device id -> (GPU, GPU instance or None), from NVML's identities and MIG devices."""

    def __init__(self, context: CollectorContext) -> None:
        self.context = context
        self.gpus: dict[str, int] = {}
        self.migs: dict[str, tuple[int, int]] = {}
        self.slots: dict[tuple[int, int], int] = {}  # (GPU, MIG device index) -> instance
        self.minors: dict[int, int] = {}  # minor number (/dev/nvidiaN) -> GPU
        self.placements: dict[int, dict[int, Placement]] = {}  # GPU -> instance -> placement
        self._mig_read = self._minors_read = False

    def refresh(self) -> None:
        ctx = self.context
        self.gpus = {i.uuid: i.index for i in ctx.identities() if i is not None}
        self.placements = {}
        self._mig_read = self._minors_read = False

    def _read_minors(self) -> None:
        """Each GPU's minor number, read once per answer and only when one is asked for."""
        if self._minors_read or self.context.backend is None:
            return
        self._minors_read = True
        backend, self.minors = self.context.backend, {}
        for gpu in range(self.context.gpu_count):
            handle = backend.handle(gpu) if self.context.readable(gpu) else None
            minor = None if handle is None else backend.call(
                "nvmlDeviceGetMinorNumber", handle, gpu=gpu)
            if minor is not None:
                self.minors[int(minor)] = gpu

    def _by_minor(self, minor: str, instance: str | None) -> tuple[int, int | None] | None:
        self._read_minors()
        gpu = self.minors.get(int(minor))
        if gpu is None or instance is None:
            return None if gpu is None else (gpu, None)
        self._read_migs()
        found = (gpu, int(instance))
        return found if found in self.migs.values() else None

    def _read_migs(self) -> None:
        """MIG devices, read once per answer and only when one is asked for."""
        if self._mig_read or self.context.backend is None:
            return
        self._mig_read = True
        for gpu in range(self.context.gpu_count):
            if self.context.readable(gpu):
                for d in read_mig_devices(self.context.backend, gpu)[1]:
                    self.migs[d.mig_uuid] = (d.gpu, d.gpu_instance)
                    self.slots[(d.gpu, d.index)] = d.gpu_instance

    def find(self, device_id: str) -> tuple[int, int | None] | None:
        device_id = device_id.split("::", 1)[0]  # time-slicing replicas: GPU-...::3
        if device_id in self.gpus:
            return self.gpus[device_id], None
        if (old := _OLD_MIG.match(device_id)) is not None:
            gpu = self.gpus.get(old.group(1))
            return None if gpu is None else (gpu, int(old.group(2)))
        if device_id.startswith("MIG-"):
            if device_id not in self.migs:
                self._read_migs()
            return self.migs.get(device_id)
        if (gke := _GKE.match(device_id)) is not None:
            return self._by_minor(gke.group(1), gke.group(2))
        if (index := _INDEX.match(device_id)) is not None:
            gpu = int(index.group(1))
            if gpu >= self.context.gpu_count:
                return None
            if index.group(2) is None:
                return gpu, None
            self._read_migs()
            slot = self.slots.get((gpu, int(index.group(2))))
            return None if slot is None else (gpu, slot)
        return None

    def find_dynamic(self, device: str) -> tuple[int, int | None] | None:
        """A device NVIDIA's DRA driver allocated: `gpu-<minor>`, or a UUID."""
        if device.startswith(("GPU-", "MIG-")):
            return self.find(device)
        if (gpu := _DRA_GPU.match(device)) is not None:
            return self._by_minor(gpu.group(1), None)
        if (mig := _DRA_MIG.match(device)) is not None:
            return self._dra_mig(int(mig.group(1)), mig.group(2).split("-"))
        return None

    def _dra_mig(self, minor: int, parts: list[str]) -> tuple[int, int | None] | None:
        """The GPU instance a DRA MIG name's placement fits, when exactly one fits."""
        self._read_minors()
        gpu = self.minors.get(minor)
        if gpu is None or self.context.backend is None:
            return None
        if gpu not in self.placements:
            self._read_migs()
            instances = sorted({gi for g, gi in self.migs.values() if g == gpu})
            self.placements[gpu] = read_placements(self.context.backend, gpu, instances)
        numbers = [int(p) for p in parts if p.isdigit()]
        named = not parts[0].isdigit()  # a profile name first (dynamic MIG forms)
        fits = set()
        for gi, p in self.placements[gpu].items():
            forms = ([[p.start], [p.start, p.start + p.size - 1], [p.profile_id, p.start]]
                     if named else [[p.profile_id, p.start, p.size]])
            if numbers in forms:
                fits.add(gi)
        return (gpu, fits.pop()) if len(fits) == 1 else None


_NO_META = PodMeta("")


class KubernetesCollector(HoldsResources):
    name = "kubernetes"

    def __init__(self, socket_path: str, context: CollectorContext, timeout: float = 2.0,
                 grpc: Any = None, pods: PodWatcher | None = None,
                 pod_labels: re.Pattern[str] | None = None) -> None:
        """`pods`: the API server's pods (started), with `pod_labels` the label names to
        copy; None: the kubelet alone."""
        self.socket_path = os.path.abspath(socket_path)
        self.pods = pods
        self.pod_labels = pod_labels
        self.context = context
        self.timeout = timeout
        self.grpc = grpc
        self._devices = _Devices(context)
        self._channel: Any = None
        self._call: Any = None
        self._inode: tuple[int, int] | None = None
        self._failures = dict.fromkeys(FAILURE_REASONS, 0)
        self._last: tuple[float, tuple[PodDevice, ...], int] | None = None
        self._dropped = 0
        self._problem = ""
        self._lock = threading.Lock()
        if grpc is None:
            log.warning("kubernetes collector: %s", NO_GRPC)

    def read(self) -> KubernetesReading:
        with self._lock:
            now = self.context.clock()
            answer, reason = self._list()
            if answer is not None:
                devices, unmatched = self._match(answer)
                self._last = (now, devices, unmatched)
            else:
                self._failures[reason] += 1
                if self._last is not None and now - self._last[0] > KEEP_SECONDS:
                    self._last = None  # too old to trust: the pods may be gone
            last = self._last
            devices = last[1] if last else ()
            problem = "" if answer is not None else self._problem
            labels: tuple[PodLabels, ...] = ()
            api_up, api_failures = None, {}
            if self.pods is not None:
                known = self.pods.pods()
                devices = tuple(replace(d, pod_uid=known.get((d.namespace, d.pod),
                                                             _NO_META).uid)
                                for d in devices)
                labels = self._labels(devices, known)
                api_up, api_failures = self.pods.up, dict(self.pods.failures)
                if self.pods.problem:
                    api = f"pod UIDs and labels from the API server: {self.pods.problem}"
                    problem = f"{problem}; {api}" if problem else api
            return KubernetesReading(
                devices=devices, up=answer is not None,
                failures_total=MappingProxyType(dict(self._failures)),
                last_success=last[0] if last else 0.0, unmatched=last[2] if last else 0,
                dropped_total=self._dropped, problem=problem, pod_labels=labels,
                api_up=api_up, api_failures_total=MappingProxyType(api_failures))

    def _labels(self, devices: tuple[PodDevice, ...],
                known: Mapping[tuple[str, str], PodMeta]) -> tuple[PodLabels, ...]:
        """The copied labels of each known pod that holds a device here."""
        out = []
        for key in sorted({(d.namespace, d.pod) for d in devices}):
            meta = known.get(key)
            if meta is None or self.pod_labels is None:
                continue
            chosen: dict[str, str] = {}
            for name in sorted(meta.labels):
                if self.pod_labels.fullmatch(name) and len(chosen) < MAX_POD_LABELS:
                    chosen.setdefault(label_name(name), meta.labels[name])
            out.append(PodLabels(key[0], key[1], meta.uid, tuple(sorted(chosen.items()))))
        return tuple(out)

    def close(self) -> None:
        if self.pods is not None:
            self.pods.stop()
        with self._lock:
            self._drop_channel()

    # -- the call ------------------------------------------------------------------------
    def _list(self) -> tuple[list[ContainerDevices] | None, str]:
        """The kubelet's answer, or None and why not."""
        path = self.socket_path
        if self.grpc is None:
            self._problem = NO_GRPC
            return None, "no_grpc"
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._drop_channel()
            self._problem = (f"the kubelet's pod-resources socket {path} does not exist "
                             "(is its directory mounted?)")
            return None, "absent"
        except OSError as exc:
            self._drop_channel()
            self._problem = f"the kubelet's pod-resources socket {path}: {exc.strerror}"
            return None, "error"
        if not stat.S_ISSOCK(st.st_mode):
            self._drop_channel()
            self._problem = f"{path} is not a socket"
            return None, "not_a_socket"
        if self._call is None or self._inode != (st.st_dev, st.st_ino):
            self._connect((st.st_dev, st.st_ino))
        try:
            raw = self._call(b"", timeout=self.timeout)
        except self.grpc.RpcError as exc:
            self._drop_channel()  # a fresh channel next time: no reconnect backoff
            code = exc.code() if hasattr(exc, "code") else None
            reason = ("timeout" if code == self.grpc.StatusCode.DEADLINE_EXCEEDED else
                      "unavailable" if code == self.grpc.StatusCode.UNAVAILABLE else "error")
            self._problem = f"the kubelet did not answer on {path} ({reason})"
            if not os.access(path, os.W_OK):
                self._problem += ": no permission to connect (the socket admits root only)"
            return None, reason
        try:
            return parse_list_response(raw, b"nvidia.com"), ""
        except BadMessage as exc:
            log.debug("kubelet answer refused: %s", exc)
            self._problem = f"the kubelet's answer could not be decoded: {exc}"
            return None, "bad_response"

    def _connect(self, inode: tuple[int, int]) -> None:
        self._drop_channel()
        grpc = self.grpc
        self._channel = grpc.insecure_channel(f"unix:{self.socket_path}", options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.enable_retries", 0)])
        # no (de)serializers: the request is empty, the answer is decoded by hand
        self._call = self._channel.unary_unary(LIST_METHOD)
        self._inode = inode

    def _drop_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._call = self._inode = None

    # -- devices ---------------------------------------------------------------------------
    def _match(self, answer: list[ContainerDevices]) -> tuple[tuple[PodDevice, ...], int]:
        """The answer's NVIDIA devices on this node's GPUs, deduplicated, sorted, capped;
        and how many device ids named nothing here."""
        self._devices.refresh()
        uuids = {i.index: i.uuid for i in self.context.identities() if i is not None}
        found: set[PodDevice] = set()
        unmatched = 0
        for entry in answer:
            if not _wanted(entry):
                continue
            if not all(map(_usable_name, (entry.namespace, entry.pod, entry.container))):
                unmatched += len(entry.device_ids)
                continue
            for device_id in entry.device_ids:
                where = (self._devices.find_dynamic(device_id) if entry.dynamic
                         else self._devices.find(device_id))
                if where is None or where[0] not in uuids:
                    unmatched += 1
                    continue
                found.add(PodDevice(where[0], uuids[where[0]], where[1], entry.namespace,
                                    entry.pod, entry.container))
        ordered = sorted(found, key=lambda d: (d.gpu, -1 if d.gpu_instance is None
                                               else d.gpu_instance, d.namespace, d.pod,
                                               d.container))
        self._dropped += max(0, len(ordered) - MAX_SERIES)
        return tuple(ordered[:MAX_SERIES]), unmatched
