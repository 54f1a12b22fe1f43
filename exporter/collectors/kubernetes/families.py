"""Kubernetes reading -> `gpu_pod_info` (a join metric, like `gpu_hpc_job_info`) and the
collector's own figures.

`gpu_pod_info{gpu, uuid, namespace, pod, container, gpu_instance}` is 1 for each device a
container holds; `gpu_instance` is the MIG GPU instance id, empty for a whole GPU (so,
in Prometheus, absent: joins on `gpu, uuid` see whole GPUs as before). `pod_uid` is the
pod's UID from the API server (with `--kubernetes.pod-labels`; empty otherwise), which
tells a StatefulSet's restarted pod from its predecessor of the same name.

`gpu_pod_labels_info{namespace, pod, pod_uid, label_*}` is a separate family, one series
per pod holding a device here, so that the copied labels multiply no GPU series.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.collectors.kubernetes.apiserver import API_FAILURES
from exporter.collectors.kubernetes.reading import FAILURE_REASONS, KubernetesReading
from exporter.collectors.registry import counts_by
from exporter.sampling.snapshot import Snapshot

__all__ = ["kubernetes_families"]


def kubernetes_families(reading: KubernetesReading, snapshot: Snapshot) -> Iterator[Metric]:
    info = InfoMetricFamily("gpu_pod", "Kubernetes container holding the GPU, or a MIG "
                            "instance of it (gpu_instance, empty for the whole GPU); value 1. "
                            "Join it into GPU series on gpu and uuid.",
                            labels=["gpu", "uuid", "namespace", "pod", "container",
                                    "gpu_instance", "pod_uid"])
    for d in reading.devices:
        info.add_metric([str(d.gpu), d.uuid, d.namespace, d.pod, d.container,
                         "" if d.gpu_instance is None else str(d.gpu_instance), d.pod_uid],
                        {})
    if info.samples:
        yield info
    labels = InfoMetricFamily("gpu_pod_labels", "The labels of a pod holding a GPU here "
                              "whose names match --kubernetes.pod-labels, as label_<name>; "
                              "value 1. Join it to gpu_pod_info on namespace, pod and "
                              "pod_uid.", labels=["namespace", "pod", "pod_uid"])
    for pod in getattr(reading, "pod_labels", ()):
        labels.add_metric([pod.namespace, pod.pod, pod.pod_uid], dict(pod.labels))
    if labels.samples:
        yield labels
    api_up = getattr(reading, "api_up", None)
    if api_up is not None:
        yield GaugeMetricFamily("cte_kubernetes_api_up", "1 if the last call to the API "
                                "server (the pods of this node, for pod UIDs and labels) "
                                "succeeded.", value=1.0 if api_up else 0.0)
        yield counts_by("cte_kubernetes_api_failures", "Failed calls to the API server for "
                        "this node's pods, by reason.", "reason", API_FAILURES,
                        reading.api_failures_total)
    yield GaugeMetricFamily("cte_kubernetes_pod_resources_up", "1 if the last call to the "
                            "kubelet's pod-resources API succeeded.",
                            value=1.0 if reading.up else 0.0)
    yield counts_by("cte_kubernetes_pod_resources_failures", "Failed calls to the kubelet's "
                    "pod-resources API, by reason.", "reason", FAILURE_REASONS,
                    reading.failures_total)
    if reading.last_success:
        yield GaugeMetricFamily("cte_kubernetes_pod_resources_last_success_timestamp_seconds",
                                "When the answer gpu_pod_info shows was received (epoch).",
                                value=reading.last_success)
    yield GaugeMetricFamily("cte_kubernetes_devices_unmatched", "Device ids of nvidia.com "
                            "resources in the last answer that name no GPU or MIG device "
                            "here (or a container name that cannot be a label).",
                            value=float(reading.unmatched))
    yield CounterMetricFamily("cte_kubernetes_pod_devices_dropped", "gpu_pod_info series left "
                              "out past the cap of 1024 per answer, over every answer.",
                              value=float(reading.dropped_total))
