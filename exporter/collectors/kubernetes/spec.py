"""The kubernetes collector's spec: its flag, options, factory and families."""

from __future__ import annotations

import os
from typing import Any

from exporter.collectors.kubernetes.families import kubernetes_families
from exporter.collectors.kubernetes.reading import (
    DEFAULT_SOCKET,
    KubernetesSource,
    import_grpc,
)
from exporter.collectors.registry import CollectorSpec
from exporter.options import Option
from exporter.sampling.collector_api import CollectorContext


def _default(config: Any) -> bool:
    """On when a socket is configured, or when the kubelet's is there at start."""
    return config.kubernetes_pod_resources_socket is not None or os.path.exists(DEFAULT_SOCKET)


def _make(config: Any, context: CollectorContext) -> KubernetesSource:
    path = config.kubernetes_pod_resources_socket or DEFAULT_SOCKET
    return KubernetesSource(path, context, config.kubernetes_timeout_seconds, import_grpc())


def _path_problem(text: str) -> str | None:
    return None if text.strip() else "expected a socket path"


SPEC = CollectorSpec(
    name="kubernetes",
    help="which pod and container holds which GPU or MIG device, from the kubelet's "
    "pod-resources API (default: on when --kubernetes.pod-resources-socket is given or "
    f"{DEFAULT_SOCKET} exists at start)",
    default=_default,
    factory=_make,
    families=kubernetes_families,
    interval=lambda config: config.kubernetes_refresh_interval_seconds,
    options=(
        Option("kubernetes_pod_resources_socket", "--kubernetes.pod-resources-socket", str,
               None, f"the kubelet's pod-resources socket (unset: {DEFAULT_SOCKET}, used "
               "when it exists at start; given: used even if it appears only later)",
               metavar="PATH", optional=True, check=_path_problem),
        Option("kubernetes_refresh_interval_seconds", "--kubernetes.refresh-interval", float,
               5.0, "how often the kubelet is asked which pod holds which GPU", 0.5, 600.0,
               metavar="SECONDS"),
        Option("kubernetes_timeout_seconds", "--kubernetes.timeout", float, 2.0,
               "deadline of one call to the kubelet", 0.1, 60.0, metavar="SECONDS"),
    ),
)
