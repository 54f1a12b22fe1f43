"""The Kubernetes collector's spec: its flag, settings, factory and families.

The collector's modules (the kubelet's client, the API server's watcher, its families)
are imported when it is made or its reading rendered: a node without Kubernetes never
loads them."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric

from exporter.collectors.registry import CollectorSpec
from exporter.options import setting
from exporter.sampling.collector_api import CollectorContext
from exporter.sampling.snapshot import Snapshot

if TYPE_CHECKING:
    from exporter.collectors.kubernetes.reading import KubernetesCollector, KubernetesReading

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def _path_problem(text: str) -> str | None:
    return None if text.strip() else "expected a socket path"


def _regex_problem(text: str) -> str | None:
    if not text:
        return "expected a regular expression of pod label names (leave unset for none)"
    try:
        re.compile(text)
    except re.error as exc:
        return f"not a regular expression: {exc}"
    return None


@dataclass(frozen=True)
class KubernetesSettings:
    pod_resources_socket: str | None = setting(
        None, f"the kubelet's pod-resources socket (unset: {DEFAULT_SOCKET}, used when it "
        "exists at start; given: used even if it appears only later)",
        key="kubernetes_pod_resources_socket", flag="--kubernetes.pod-resources-socket",
        metavar="PATH", optional=True, check=_path_problem)
    refresh_interval_seconds: float = setting(
        5.0, "how often the kubelet is asked which pod holds which GPU",
        key="kubernetes_refresh_interval_seconds", flag="--kubernetes.refresh-interval",
        low=0.5, high=600.0, metavar="SECONDS")
    timeout_seconds: float = setting(
        2.0, "deadline of one call to the kubelet", key="kubernetes_timeout_seconds",
        flag="--kubernetes.timeout", low=0.1, high=60.0, metavar="SECONDS")
    pod_labels: str | None = setting(
        None, "pod labels whose names match REGEX (the whole name) are copied onto "
        "gpu_pod_labels_info, and gpu_pod_info gets each pod's pod_uid; the pods of this "
        "node are then read from the API server (in-cluster service account, NODE_NAME); "
        "unset: the kubelet alone", key="kubernetes_pod_labels",
        flag="--kubernetes.pod-labels", metavar="REGEX", optional=True,
        check=_regex_problem)


def _default(settings: KubernetesSettings) -> bool:
    """On when a socket is configured, or when the kubelet's is there at start."""
    return settings.pod_resources_socket is not None or os.path.exists(DEFAULT_SOCKET)


def _make(settings: KubernetesSettings, context: CollectorContext) -> KubernetesCollector:
    from exporter.collectors.kubernetes.apiserver import PodWatcher, in_cluster
    from exporter.collectors.kubernetes.reading import KubernetesCollector, import_grpc

    path = settings.pod_resources_socket or DEFAULT_SOCKET
    if settings.pod_labels is None:
        return KubernetesCollector(path, context, settings.timeout_seconds, import_grpc())
    pods = PodWatcher(in_cluster()).start()
    return KubernetesCollector(path, context, settings.timeout_seconds, import_grpc(),
                               pods, re.compile(settings.pod_labels))



def _families(reading: KubernetesReading, snapshot: Snapshot) -> Iterator[Metric]:
    from exporter.collectors.kubernetes.families import kubernetes_families

    return kubernetes_families(reading, snapshot)


SPEC = CollectorSpec(
    name="kubernetes",
    help="which pod and container holds which GPU or MIG device, from the kubelet's "
    "pod-resources API (default: on when --kubernetes.pod-resources-socket is given or "
    f"{DEFAULT_SOCKET} exists at start)",
    default=_default,
    factory=_make,
    families=_families,
    settings=KubernetesSettings,
    interval=lambda settings: settings.refresh_interval_seconds,
)
