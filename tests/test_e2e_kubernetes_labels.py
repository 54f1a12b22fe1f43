"""End to end: the chart's ServiceMonitor keeps pod attribution right in a real Prometheus.

The Prometheus Operator turns a ServiceMonitor endpoint into a scrape job whose targets
carry the exporter's own `namespace`, `pod` and `container` labels. Here a real
Prometheus scrapes an exporter (pods from the fake kubelet) twice: once with the scrape
settings the chart renders (`honorLabels`, the relabelings, translated as the Operator
does), once the same without honorLabels, and loads the recording rules. With the chart's
settings `gpu_pod_info` and the per-pod rules name the pods holding the GPUs and
`instance` is the node's name; without honorLabels they name the exporter's own pod, the
failure operators of other exporters report.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from exporter.sim.physics import gpu_uuid
from tests.prom import Prometheus
from tests.tools import REPO, require_module, wait_for

grpc = require_module("grpc")
from tests.fake_kubelet import FakeKubelet, Holding  # noqa: E402

pytestmark = pytest.mark.e2e

UUIDS = [gpu_uuid(1, i) for i in range(8)]  # the fake's GPUs (seed 1)
NODE = "gpu-node-7"
# what the Operator attaches to every target of the job (the exporter's own pod)
OPERATOR_TARGET_LABELS = {"namespace": "monitoring", "pod": "gpu-telemetry-x7k2p",
                          "container": "exporter", "__meta_kubernetes_pod_node_name": NODE}


def chart_endpoint(values: dict[str, Any] | None = None) -> dict[str, Any]:
    helm = require_module("helm_python")
    helm.disable_logging()
    with helm.Chart.load(REPO / "deploy" / "helm" / "cluster-telemetry-exporter") as chart:
        rendered = chart.render(values or {}, name="gpu-telemetry", namespace="monitoring")
    (monitor,) = [d for text in rendered.values() for d in yaml.safe_load_all(text)
                  if d and d["kind"] == "ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    return endpoint


def snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


def scrape_job(name: str, endpoint: dict[str, Any], target: str, honor: bool) -> dict:
    """The Prometheus job the Operator makes of a ServiceMonitor endpoint (the parts that
    decide labels)."""
    def rules(key: str) -> list[dict]:
        return [{snake(k): v for k, v in rule.items()} for rule in endpoint.get(key, [])]

    return {"job_name": name, "honor_labels": honor, "metrics_path": endpoint["path"],
            "scrape_interval": "1s", "relabel_configs": rules("relabelings"),
            "metric_relabel_configs": rules("metricRelabelings"),
            "static_configs": [{"targets": [target], "labels": OPERATOR_TARGET_LABELS}]}


def test_honor_labels_keeps_the_pods_and_instance_is_the_node(running_exporter, tmp_path):
    endpoint = chart_endpoint()
    assert endpoint["honorLabels"] is True
    kubelet = FakeKubelet(str(tmp_path / "k.sock"), [
        Holding("team-a", "llama-0", "trainer", "nvidia.com/gpu", (UUIDS[0], UUIDS[1])),
        Holding("team-b", "bert-7", "worker", "nvidia.com/gpu", ("nvidia4",))]).start()
    prom = None
    try:
        exp = running_exporter.start(kubernetes_pod_resources_socket=kubelet.path,
                                     kubernetes_refresh_interval_seconds=1.0)
        target = f"127.0.0.1:{exp.port}"
        prom = Prometheus(tmp_path, [], scrape_configs=[
            scrape_job("chart", endpoint, target, honor=True),
            scrape_job("no-honor", endpoint, target, honor=False)],
            rule_files=[str(REPO / "alerts" / name)
                            for name in ("recording.yml", "global-recording.yml")])

        def held(job: str) -> list[dict]:
            found = prom.query(f'gpu_pod_info{{job="{job}"}}')
            return found if len(found) == 3 else []

        ours = [s["metric"] for s in wait_for(lambda: held("chart"), timeout=60)]
        assert {(m["namespace"], m["pod"], m["container"], m["gpu"]) for m in ours} == {
            ("team-a", "llama-0", "trainer", "0"), ("team-a", "llama-0", "trainer", "1"),
            ("team-b", "bert-7", "worker", "5")}  # nvidia4: minor 4 is GPU 5 on the fake
        assert all(m["instance"] == NODE and m["node"] == NODE for m in ours)
        assert not any(k.startswith("exported_") for m in ours for k in m)

        # the same scrape without honorLabels (and the metric relabelings the chart adds
        # then): the exporter's pod wins, ours is renamed
        theirs = [s["metric"] for s in wait_for(lambda: held("no-honor"), timeout=30)]
        assert {m["namespace"] for m in theirs} == {"monitoring"}
        assert {m["exported_namespace"] for m in theirs} == {"team-a", "team-b"}

        # and the per-pod recording rules follow: the pods with the chart, the exporter
        # with the other job
        def gpus_held() -> dict[tuple[str, str], float]:
            got = {(s["metric"]["namespace"], s["metric"]["pod"]): float(s["value"][1])
                   for s in prom.query("namespace_pod:gpus_held:sum")}
            return got if len(got) == 3 else {}

        assert wait_for(gpus_held, timeout=60) == {
            ("team-a", "llama-0"): 2.0, ("team-b", "bert-7"): 1.0,
            ("monitoring", "gpu-telemetry-x7k2p"): 3.0}
    finally:
        if prom is not None:
            prom.stop()
        kubelet.stop()


HELD = {("team-a", "llama-0", "trainer", "0"), ("team-a", "llama-0", "trainer", "1"),
        ("team-b", "bert-7", "worker", "3")}


def test_compat_scrapes_as_the_gpu_operator_unless_told(running_exporter, tmp_path):
    """With dcgm-exporter's families on, the chart scrapes as the GPU Operator does
    (honorLabels false): an adapter-style query on exported_pod gives the pods' GPUs and no
    others. serviceMonitor.honorLabels=true scrapes as OpenCost's documented setup: a query
    on pod gives the pods' GPUs and no others. A GPU no pod holds is never the exporter's
    pod's: under the first its holder labels are absent (pod is the target's, on every
    series of the job, as under the GPU Operator); under the second it has none."""
    compat = {"metrics": {"compat": "dcgm-exporter"}}
    gpu_operator = chart_endpoint(compat)
    opencost = chart_endpoint({**compat, "serviceMonitor": {"honorLabels": True}})
    assert gpu_operator["honorLabels"] is False and opencost["honorLabels"] is True
    kubelet = FakeKubelet(str(tmp_path / "k.sock"), [
        Holding("team-a", "llama-0", "trainer", "nvidia.com/gpu", (UUIDS[0], UUIDS[1])),
        Holding("team-b", "bert-7", "worker", "nvidia.com/gpu", (UUIDS[3],))]).start()
    prom = None
    try:
        exp = running_exporter.start(metrics_compat="dcgm-exporter",
                                     kubernetes_pod_resources_socket=kubelet.path,
                                     kubernetes_refresh_interval_seconds=1.0)
        target = f"127.0.0.1:{exp.port}"
        prom = Prometheus(tmp_path, [], scrape_configs=[
            scrape_job("gpu-operator", gpu_operator, target, honor=False),
            scrape_job("opencost", opencost, target, honor=True)])

        def series(expr: str, want: int) -> list[dict]:
            def got() -> list[dict]:
                found = [s["metric"] for s in prom.query(expr)]
                return found if len(found) == want else []
            return wait_for(got, timeout=60)

        # prometheus-adapter's rule for dcgm-exporter under the GPU Operator
        adapter = series('DCGM_FI_DEV_GPU_UTIL{job="gpu-operator", exported_namespace!="",'
                         ' exported_pod!=""}', 3)
        assert {(m["exported_namespace"], m["exported_pod"], m["exported_container"],
                 m["gpu"]) for m in adapter} == HELD
        # OpenCost's, with honor_labels on
        cost = series('DCGM_FI_DEV_GPU_UTIL{job="opencost", container!="", pod!=""}', 3)
        assert {(m["namespace"], m["pod"], m["container"], m["gpu"]) for m in cost} == HELD
        assert not any(k.startswith("exported_") for m in cost for k in m)

        # GPU 2, which no pod holds
        (free,) = series('DCGM_FI_DEV_GPU_UTIL{job="gpu-operator", gpu="2"}', 1)
        assert not any(k.startswith("exported_") for k in free)
        assert free["pod"] == OPERATOR_TARGET_LABELS["pod"]  # the target's, on every series
        (free,) = series('DCGM_FI_DEV_GPU_UTIL{job="opencost", gpu="2"}', 1)
        assert not {"namespace", "pod", "container"} & set(free)

        # what is the same under both: every DCGM label, instance (the node's name)
        for job in ("gpu-operator", "opencost"):
            (m,) = series(f'DCGM_FI_DEV_GPU_TEMP{{job="{job}", gpu="5"}}', 1)
            assert m["instance"] == NODE and m["UUID"] == UUIDS[5] and m["device"] == "nvidia5"
        # our own gpu_pod_info keeps the holders' labels under both
        for job in ("gpu-operator", "opencost"):
            ours = series(f'gpu_pod_info{{job="{job}"}}', 3)
            assert {(m["namespace"], m["pod"], m["container"], m["gpu"]) for m in ours} == HELD
            assert not any(k.startswith("exported_") for m in ours for k in m)
    finally:
        if prom is not None:
            prom.stop()
        kubelet.stop()
