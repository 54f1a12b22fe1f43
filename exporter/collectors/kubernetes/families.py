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

from prometheus_client.metrics_core import Metric

from exporter.collectors.kubernetes.apiserver import API_FAILURES
from exporter.collectors.kubernetes.reading import FAILURE_REASONS, MAX_SERIES, KubernetesReading
from exporter.families import MINIMAL, Family
from exporter.sampling.snapshot import Snapshot

__all__ = ["DECLARED", "kubernetes_families"]

POD_INFO = Family(
    "gpu_pod_info", "info",
    "Kubernetes container holding the GPU, or a MIG instance of it (gpu_instance, empty for "
    "the whole GPU); value 1. Join it into GPU series on gpu and uuid.",
    ("gpu", "uuid", "namespace", "pod", "container", "gpu_instance", "pod_uid"),
    source="kubelet pod-resources `List` (devices and DRA `dynamic_resources`); `pod_uid` "
           "from the API server", profile=MINIMAL,
    doc="Container holding the GPU (or, with `gpu_instance`, one of its MIG instances; empty "
        "for the whole GPU), and the pod's UID (with `--kubernetes.pod-labels`, once the API "
        "server has named the pod; empty otherwise); value 1. Join it into GPU series on "
        "`gpu`, `uuid` (present only when the kubernetes collector is on).")
# Its labels as declared are the fixed ones: each copied pod label adds a label_<name>
POD_LABELS = Family(
    "gpu_pod_labels_info", "info",
    "The labels of a pod holding a GPU here whose names match --kubernetes.pod-labels, as "
    "label_<name>; value 1. Join it to gpu_pod_info on namespace, pod and pod_uid.",
    ("namespace", "pod", "pod_uid"),
    source="API server: the pods of this node (`spec.nodeName`)",
    more_labels="`label_<name>`...",
    doc="One series per pod holding a GPU or MIG device here, with its labels whose names "
        "match `--kubernetes.pod-labels` (the whole name), each as `label_<name>` "
        "(characters other than letters, digits and `_` written `_`, as kube-state-metrics "
        "does; 32 at most); value 1. Join it to `gpu_pod_info` on `namespace`, `pod`, "
        "`pod_uid` (present only when `--kubernetes.pod-labels` is set and the API server "
        "has named the pod).")
API_UP = Family(
    "cte_kubernetes_api_up", "gauge",
    "1 if the last call to the API server (the pods of this node, for pod UIDs and labels) "
    "succeeded.", source="exporter",
    doc="1 if the last list or watch of this node's pods on the API server worked (present "
        "only when `--kubernetes.pod-labels` is set).")
API_FAILURES_TOTAL = Family(
    "cte_kubernetes_api_failures_total", "counter",
    "Failed calls to the API server for this node's pods, by reason.", ("reason",),
    source="exporter",
    doc="Failed calls to the API server, by reason: `unauthorized` (401, or no service "
        "account token or CA), `forbidden` (403: the ClusterRole lacks pods), `unavailable` "
        "(no answer, a reset connection, 5xx), `bad_response` (not a PodList or watch "
        "event), `gone` (410: the watch's version is too old, listed again) (present only "
        "when `--kubernetes.pod-labels` is set).")
POD_RESOURCES_UP = Family(
    "cte_kubernetes_pod_resources_up", "gauge",
    "1 if the last call to the kubelet's pod-resources API succeeded.", source="exporter",
    doc="1 if the last call to the kubelet succeeded (present only when the kubernetes "
        "collector is on).")
POD_RESOURCES_FAILURES = Family(
    "cte_kubernetes_pod_resources_failures_total", "counter",
    "Failed calls to the kubelet's pod-resources API, by reason.", ("reason",),
    source="exporter",
    doc="Failed calls to the kubelet, by reason: `absent` (no socket), `not_a_socket` (a "
        "file that is not a socket: never dialled), `unavailable`, `timeout`, `error` "
        "(another gRPC status), `bad_response` (not a pod-resources answer), `no_grpc` (the "
        "extra is not installed) (present only when the kubernetes collector is on).")
LAST_SUCCESS = Family(
    "cte_kubernetes_pod_resources_last_success_timestamp_seconds", "gauge",
    "When the answer gpu_pod_info shows was received (epoch).", unit="s", source="exporter",
    doc="When the answer `gpu_pod_info` shows was received (present only when the "
        "kubernetes collector has had an answer).")
UNMATCHED = Family(
    "cte_kubernetes_devices_unmatched", "gauge",
    "Device ids of nvidia.com resources in the last answer that name no GPU or MIG device "
    "here (or a container name that cannot be a label).", source="exporter",
    doc="Device ids of `nvidia.com/` resources (and devices of the `gpu.nvidia.com` DRA "
        "driver) in the last answer that name no GPU or MIG device here, or whose pod or "
        "container name cannot be a label (present only when the kubernetes collector is "
        "on).")
DEVICES_DROPPED = Family(
    "cte_kubernetes_pod_devices_dropped_total", "counter",
    f"gpu_pod_info series left out past the cap of {MAX_SERIES} per answer, over every "
    "answer.",
    source="exporter",
    doc=f"`gpu_pod_info` series left out past {MAX_SERIES:,} per answer, over every answer "
        "(present only when the kubernetes collector is on).")

DECLARED = (POD_INFO, POD_LABELS, API_UP, API_FAILURES_TOTAL, POD_RESOURCES_UP,
            POD_RESOURCES_FAILURES, LAST_SUCCESS, UNMATCHED, DEVICES_DROPPED)


def kubernetes_families(reading: KubernetesReading, snapshot: Snapshot) -> Iterator[Metric]:
    info = POD_INFO.info(by=POD_INFO.labels)
    for d in reading.devices:
        info.add_metric([str(d.gpu), d.uuid, d.namespace, d.pod, d.container,
                         "" if d.gpu_instance is None else str(d.gpu_instance), d.pod_uid],
                        {})
    if info.samples:
        yield info
    labels = POD_LABELS.info(by=POD_LABELS.labels)  # the label_<name> ones in each dict
    for pod in getattr(reading, "pod_labels", ()):
        labels.add_metric([pod.namespace, pod.pod, pod.pod_uid], dict(pod.labels))
    if labels.samples:
        yield labels
    api_up = getattr(reading, "api_up", None)
    if api_up is not None:
        yield API_UP.gauge(1.0 if api_up else 0.0)
        yield API_FAILURES_TOTAL.by_label(reading.api_failures_total, API_FAILURES)
    yield POD_RESOURCES_UP.gauge(1.0 if reading.up else 0.0)
    yield POD_RESOURCES_FAILURES.by_label(reading.failures_total, FAILURE_REASONS)
    if reading.last_success:
        yield LAST_SUCCESS.gauge(reading.last_success)
    yield UNMATCHED.gauge(float(reading.unmatched))
    yield DEVICES_DROPPED.counter(float(reading.dropped_total))
