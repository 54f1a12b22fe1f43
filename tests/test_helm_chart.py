"""The Helm chart (deploy/helm/cluster-telemetry-exporter), with Helm's own Go SDK.

Lint and render through `helm-python-sdk` (the Helm v4 SDK's C ABI: the same loader,
template engine, schema check and linter as the `helm` binary). Every rendered object is
validated against its schema: Kubernetes kinds with `kubernetes-validate` (the upstream
OpenAPI schemas), the Prometheus Operator's kinds with `cloudcoil-models-prometheus-
operator` (models generated from the Operator's CRD schemas), strictly: an object must
survive the model unchanged, so an unknown or misspelt field fails too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter import __version__
from exporter.collectors.kubernetes.spec import DEFAULT_SOCKET
from tests.tools import REPO, require_module

CHART = REPO / "deploy" / "helm" / "cluster-telemetry-exporter"
KUBERNETES_VERSION = "1.30.0"
RELEASE, NAMESPACE = "gpu-telemetry", "monitoring"

# The values sets the chart must lint and render cleanly with.
VALUES_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    # a PodMonitor instead of the ServiceMonitor, served over TLS with basic auth from a
    # Secret the chart makes, several clusters in one Prometheus
    "podmonitor-tls": {
        "serviceMonitor": {"enabled": False},
        "podMonitor": {"enabled": True, "additionalLabels": {"release": "prom"},
                       "tlsConfig": {"insecureSkipVerify": True},
                       "basicAuth": {"username": {"name": "scrape", "key": "user"},
                                     "password": {"name": "scrape", "key": "password"}}},
        "webConfig": {"tls": True, "config": {
            "tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"},
            "basic_auth_users": {"prometheus": "$2y$10$" + "x" * 53}}},
        "cluster": "eu-west-a",
        "dashboards": {"namespace": "grafana", "annotations": {"grafana_folder": "GPU"}},
    },
    # no toolkit runtime class: privileged; processes (hostPID) and Slurm-style job files
    # instead of the kubelet; an image pinned by digest
    "privileged-processes": {
        "runtimeClassName": "", "privileged": True,
        "collectors": {"processes": True, "infiniband": False},
        "kubernetes": {"podResources": False},
        "jobMappingDir": "/run/cte-jobs",
        "image": {"repository": "registry.internal/gpu/cte", "digest": "sha256:" + "a" * 64},
        "extraArgs": ["--power.drain-interval=2"],
    },
    # pod UIDs and labels from the API server: the chart adds the RBAC for it
    "pod-labels": {"kubernetes": {"copyPodLabels": r"team|queue|batch\.kubernetes\.io/job-name"}},
    # failing GPUs as a node condition: node-problem-detector in the pod, its plugin
    # asking over TLS with basic auth, a warning a problem too
    "node-problem-detector": {
        "nodeProblemDetector": {"enabled": True, "failOnWarning": True,
                                "basicAuth": {"username": "npd", "passwordSecret": "npd"}},
        "webConfig": {"existingSecret": "web", "tls": True},
    },
    # dcgm-exporter's families beside ours, under its newest label spelling
    "dcgm-compat": {"metrics": {"compat": "dcgm-exporter", "compatHostnameLabel": "hostname"}},
    # the DaemonSet alone: no Operator, no Grafana, no kubelet socket
    "plain": {
        "service": {"enabled": False}, "serviceMonitor": {"enabled": False},
        "prometheusRule": {"enabled": False}, "dashboards": {"enabled": False},
        "kubernetes": {"podResources": False}, "webConfig": {"existingSecret": "mine"},
    },
}


@pytest.fixture(scope="module")
def helm():
    module = require_module("helm_python")
    module.disable_logging()
    return module


def objects(helm, values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [doc for text in manifests.values() for doc in yaml.safe_load_all(text) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = by_kind(docs, kind)
    return found


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The exporter's container (node-problem-detector's may be beside it)."""
    (c,) = [c for c in only(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
            if c["name"] == "exporter"]
    return c


@pytest.mark.parametrize("name", VALUES_SETS)
def test_chart_lints_clean(helm, name):
    report = helm.lint(CHART, VALUES_SETS[name], strict=True, namespace=NAMESPACE,
                       kube_version=f"v{KUBERNETES_VERSION}")
    assert report["errors"] == [], report
    # severity 1 is "info" (an icon is recommended); warnings and errors fail
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


def _operator_models() -> dict[str, Any]:
    v1 = require_module("cloudcoil.models.prometheus_operator.v1")
    return {"ServiceMonitor": v1.ServiceMonitor, "PodMonitor": v1.PodMonitor,
            "PrometheusRule": v1.PrometheusRule}


def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, f"{path}[{i}]")
    else:
        yield path, value


def validate(doc: dict[str, Any]) -> None:
    """Raises if `doc` does not fit its kind's schema (unknown fields included)."""
    operator = _operator_models()
    if doc["kind"] in operator:
        model = operator[doc["kind"]].model_validate(doc)
        back = model.model_dump(by_alias=True, exclude_none=True, mode="json")
        lost = dict(_leaves(doc)).items() - dict(_leaves(back)).items()
        assert not lost, f"{doc['kind']}: fields the Operator's schema does not have: {lost}"
        return
    kubernetes_validate = require_module("kubernetes_validate")
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("name", VALUES_SETS)
def test_every_rendered_object_is_valid_against_its_schema(helm, name):
    docs = objects(helm, VALUES_SETS[name])
    assert by_kind(docs, "DaemonSet")
    for doc in docs:
        validate(doc)


def test_the_validators_catch_a_misspelt_field(helm):
    docs = objects(helm, {})
    monitor = only(docs, "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["honourLabels"] = True
    with pytest.raises(AssertionError, match="honourLabels"):
        validate(monitor)
    daemonset = only(docs, "DaemonSet")
    daemonset["spec"]["template"]["spec"]["hostPid"] = True
    kubernetes_validate = require_module("kubernetes_validate")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(daemonset)


@pytest.mark.parametrize("bad", [
    {"port": "9955"}, {"image": {"tag": "latest"}}, {"serviceMonitor": {"interval": "15"}},
    {"extraArgs": ["run"]}, {"kubernetes": {"podResourcesDir": "relative"}},
    {"colectors": {"processes": True}}, {"image": {"digest": "sha256:abc"}},
    {"kubernetes": {"copyPodLabels": "team\nqueue"}}, {"kubernetes": {"copyPodLabels": 3}},
    {"nodeProblemDetector": {"basicAuth": {"username": "npd"}}},
    {"nodeProblemDetector": {"condition": "gpu healthy"}},
    {"nodeProblemDetector": {"image": {"tag": "latest"}}},
    {"nodeProblemDetector": {"invokeInterval": "30"}},


    {"history": {"hostPath": "relative"}}, {"history": {"kernelLog": "yes"}},
    {"metrics": {"compat": "dcgm"}}, {"metrics": {"compatHostnameLabel": "HOSTNAME"}},
    {"serviceMonitor": {"honorLabels": "false"}}, {"podMonitor": {"honorLabels": 0}},
])
def test_values_schema_refuses_bad_values(helm, bad):
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.render(bad, name=RELEASE, namespace=NAMESPACE)


def endpoint(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    spec = only(docs, kind)["spec"]
    (found,) = spec["endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"]
    return found


@pytest.mark.parametrize(("name", "kind"), [("defaults", "ServiceMonitor"),
                                            ("podmonitor-tls", "PodMonitor")])
def test_monitors_keep_pod_labels_and_name_the_node(helm, name, kind):
    docs = objects(helm, VALUES_SETS[name])
    ep = endpoint(docs, kind)
    # the exporter's namespace/pod/container labels on gpu_pod_info win over the
    # Operator's target labels (which name the exporter's own pod)
    assert ep["honorLabels"] is True
    targets = {r["targetLabel"]: r for r in ep["relabelings"]}
    assert targets["instance"]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
    assert targets["node"]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
    assert ep["port"] == "metrics" and ep["path"] == "/metrics"
    # a default kube-prometheus-stack selects monitors by its release label
    assert "release" in only(docs, kind)["metadata"]["labels"]
    other = "PodMonitor" if kind == "ServiceMonitor" else "ServiceMonitor"
    assert by_kind(docs, other) == []


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
def test_compat_scrapes_as_the_gpu_operator_unless_told_otherwise(helm, kind):
    """With dcgm-exporter's families on, the monitors leave honorLabels false as the GPU
    Operator's ServiceMonitor does (its users' queries say exported_pod), and give our own
    gpu_pod_info its namespace, pod and container back; one value turns it around."""
    key = "serviceMonitor" if kind == "ServiceMonitor" else "podMonitor"
    monitors = {"serviceMonitor": {"enabled": kind == "ServiceMonitor"},
                "podMonitor": {"enabled": kind == "PodMonitor"}}
    compat = {**monitors, "metrics": {"compat": "dcgm-exporter"}}
    ep = endpoint(objects(helm, compat), kind)
    assert ep["honorLabels"] is False
    restored = {r["targetLabel"]: r for r in ep["metricRelabelings"]
                if r["targetLabel"] in ("namespace", "pod", "container")}
    assert set(restored) == {"namespace", "pod", "container"}
    assert restored["pod"]["sourceLabels"] == ["__name__", "exported_pod"]
    assert "gpu_pod_info" in restored["pod"]["regex"]
    assert not any("DCGM" in r["regex"] for r in ep["metricRelabelings"])
    # the user's own metric relabelings come after the chart's
    mine = {"action": "drop", "sourceLabels": ["__name__"], "regex": "DCGM_FI_DEV_VGPU.*"}
    ep = endpoint(objects(helm, {**compat, key: {**compat[key], "metricRelabelings": [mine]}}),
                  kind)
    assert ep["metricRelabelings"][-1] == mine
    # told otherwise: as OpenCost's documented setup scrapes
    told = {**compat, key: {**compat[key], "honorLabels": True}}
    ep = endpoint(objects(helm, told), kind)
    assert ep["honorLabels"] is True and "metricRelabelings" not in ep
    # without compat: honorLabels stays on, unless set off
    assert endpoint(objects(helm, monitors), kind)["honorLabels"] is True
    off = {**monitors, key: {**monitors[key], "honorLabels": False}}
    assert endpoint(objects(helm, off), kind)["honorLabels"] is False


def test_tls_and_cluster_reach_the_monitor_and_the_probes(helm):
    docs = objects(helm, VALUES_SETS["podmonitor-tls"])
    ep = endpoint(docs, "PodMonitor")
    assert ep["scheme"] == "https" and ep["basicAuth"]["username"]["name"] == "scrape"
    cluster = [r for r in ep["relabelings"] if r["targetLabel"] == "cluster"]
    assert cluster == [{"targetLabel": "cluster", "replacement": "eu-west-a"}]
    c = container(docs)
    assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    secret = only(docs, "Secret")
    web = yaml.safe_load(secret["stringData"]["web-config.yml"])
    assert web == VALUES_SETS["podmonitor-tls"]["webConfig"]["config"]
    flag = "--web.config.file=/etc/cluster-telemetry-exporter/web/web-config.yml"
    assert flag in c["args"]
    pod = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "web-config")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]


def test_prometheus_rules_are_the_alert_files(helm):
    """One PrometheusRule per alerts/*.yml, its groups the file's own (whatever groups the
    files hold), and no other."""
    docs = objects(helm, {})
    rules = {d["metadata"]["name"]: d["spec"]["groups"] for d in by_kind(docs, "PrometheusRule")}
    files = sorted((REPO / "alerts").glob("*.yml"))
    assert files and len(rules) == len(files)
    for path in files:
        expected = yaml.safe_load(path.read_text())["groups"]
        assert rules[f"{RELEASE}-cluster-telemetry-exporter-{path.stem}"] == expected, path.name
    assert by_kind(objects(helm, {"prometheusRule": {"enabled": False}}), "PrometheusRule") == []


def test_dashboards_are_configmaps_for_the_grafana_sidecar(helm):
    docs = objects(helm, VALUES_SETS["podmonitor-tls"])
    maps = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
    files = sorted((REPO / "dashboards").glob("*.json"))
    assert files and len(maps) == len(files)
    for path in files:
        cm = maps[f"{RELEASE}-cluster-telemetry-exporter-dashboard-{path.stem}"]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == "grafana"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}
        assert json.loads(cm["data"][path.name]) == json.loads(path.read_text())


def test_default_pod_gets_gpus_without_taking_one(helm):
    docs = objects(helm, {})
    pod = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    c = container(docs)
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in c["env"]
    assert "nvidia.com/gpu" not in json.dumps(c["resources"])
    assert "hostPID" not in pod
    # the kubelet's socket admits root only: root, but nothing else
    sc = c["securityContext"]
    assert sc["runAsUser"] == 0 and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert f"--kubernetes.pod-resources-socket={DEFAULT_SOCKET}" in c["args"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert paths["pod-resources"] == mounts["pod-resources"]["mountPath"] == (
        DEFAULT_SOCKET.rsplit("/", 1)[0])
    assert paths["sys"] == "/sys" and mounts["sys"]["mountPath"] == "/host/sys"
    assert mounts["sys"]["readOnly"] is True and "--path.sysfs=/host/sys" in c["args"]
    assert c["image"] == f"cluster-telemetry-exporter:{__version__}"
    assert c["resources"]["requests"]["memory"] == "96Mi"
    assert c["resources"]["limits"]["memory"] == "192Mi"
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert c[probe]["httpGet"]["path"] == path


def test_privileges_follow_what_is_asked_for(helm):
    docs = objects(helm, VALUES_SETS["privileged-processes"])
    pod = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    c = container(docs)
    assert pod["hostPID"] is True and "--collector.processes" in c["args"]
    assert "runtimeClassName" not in pod and c["securityContext"]["privileged"] is True
    assert "--no-collector.kubernetes" in c["args"] and "--no-collector.infiniband" in c["args"]
    assert "--hpc-job-mapping-dir=/run/cte-jobs" in c["args"]
    assert "--power.drain-interval=2" in c["args"]
    assert c["image"] == "registry.internal/gpu/cte@sha256:" + "a" * 64
    assert not any(v["name"] == "pod-resources" for v in pod["volumes"])

    # neither the kubelet's socket nor privileged: not root at all
    plain = objects(helm, VALUES_SETS["plain"])
    sc = container(plain)["securityContext"]
    assert sc["runAsUser"] == 65534 and sc["runAsNonRoot"] is True
    assert [d["kind"] for d in plain] == ["DaemonSet"]


def test_rbac_for_pod_labels_only_when_asked_for(helm):
    docs = objects(helm, VALUES_SETS["pod-labels"])
    role = only(docs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["get", "list", "watch"]}]
    account = only(docs, "ServiceAccount")
    binding = only(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "namespace": NAMESPACE,
                                    "name": account["metadata"]["name"]}]
    pod = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is True
    c = container(docs)
    assert r"--kubernetes.pod-labels=team|queue|batch\.kubernetes\.io/job-name" in c["args"]
    node = next(e for e in c["env"] if e["name"] == "NODE_NAME")
    assert node["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    for name in ("defaults", "plain", "privileged-processes"):
        plain = objects(helm, VALUES_SETS[name])
        kinds = {d["kind"] for d in plain}
        assert not kinds & {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}, name
        spec = only(plain, "DaemonSet")["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert not any(a.startswith("--kubernetes.pod-labels") for a in container(plain)["args"])
    # no kubelet socket, no kubernetes collector: no RBAC either
    off = objects(helm, {"kubernetes": {"podResources": False, "copyPodLabels": "team"}})
    assert "ClusterRole" not in {d["kind"] for d in off}


def test_dcgm_compat_reaches_the_exporter_with_the_node_name(helm):
    """The chart's compat values become flags the exporter takes (parsed by its own
    command line) and the node's name reaches it as NODE_NAME, dcgm-exporter's Hostname."""
    from exporter.cli import build_parser

    c = container(objects(helm, VALUES_SETS["dcgm-compat"]))
    assert "--metrics.compat=dcgm-exporter" in c["args"]
    args = build_parser().parse_args(c["args"])
    assert (args.metrics_compat, args.metrics_compat_hostname_label) == (
        "dcgm-exporter", "hostname")
    node = next(e for e in c["env"] if e["name"] == "NODE_NAME")
    assert node["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    default = container(objects(helm, {}))
    assert not any(a.startswith("--metrics.compat") for a in default["args"])


def test_the_history_lives_on_the_node_and_the_kernel_log_follows_privileges(helm):
    docs = objects(helm, {})
    pod = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    c = container(docs)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert volumes["state"]["hostPath"] == {"path": "/var/lib/cluster-telemetry-exporter",
                                           "type": "DirectoryOrCreate"}
    assert mounts["state"]["mountPath"] == "/var/lib/cluster-telemetry-exporter"
    assert "readOnly" not in mounts["state"]
    assert "--storage.path=/var/lib/cluster-telemetry-exporter" in c["args"]
    # not privileged: the kernel log is not asked for, and its absence not a degraded state
    assert "--storage.kmsg-path=" in c["args"] and "kmsg" not in volumes
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}

    privileged = objects(helm, VALUES_SETS["privileged-processes"])
    c = container(privileged)
    assert "--storage.kmsg-path=" not in c["args"]  # read: privileged sees /dev/kmsg

    asked = objects(helm, {"history": {"kernelLog": True}})
    pod = only(asked, "DaemonSet")["spec"]["template"]["spec"]
    c = container(asked)
    assert {"name": "kmsg", "hostPath": {"path": "/dev/kmsg", "type": "CharDevice"}} in (
        pod["volumes"])
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert "--storage.kmsg-path=" not in c["args"]

    off = container(objects(helm, {"history": {"hostPath": ""}}))
    assert "--storage.path=" in off["args"]
    assert not any(m["name"] == "state" for m in off["volumeMounts"])


def test_chart_app_version_is_the_package_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__


def test_chart_reads_alerts_and_dashboards_from_the_repository():
    """One source: files/ links to alerts/ and dashboards/, never a copy."""
    for name in ("alerts", "dashboards"):
        link = CHART / "files" / name
        assert link.is_symlink() and link.resolve() == (REPO / name).resolve()


def test_plain_manifests_are_rendered_from_the_chart(helm):
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "render_manifests.py"),
                             "--check"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (
        result.stderr + "\nrun: .venv/bin/python scripts/render_manifests.py")
    names = sorted(p.name for p in (REPO / "deploy" / "kubernetes").glob("*.yaml"))
    assert names == ["daemonset.yaml", "prometheusrule.yaml", "service.yaml",
                     "servicemonitor.yaml"]
    for path in (REPO / "deploy" / "kubernetes").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            validate(doc)


# -- node-problem-detector ----------------------------------------------------------------

# The keys node-problem-detector's custom plugin monitor reads
# (pkg/custompluginmonitor/types/config.go): any other is silently ignored by it.
NPD_KEYS = {"plugin", "pluginConfig", "source", "conditions", "rules", "metricsReporting"}
NPD_PLUGIN_KEYS = {"invoke_interval", "timeout", "max_output_length", "concurrency",
                   "enable_message_change_based_condition_update", "skip_initial_status"}
NPD_RULE_KEYS = {"type", "condition", "reason", "path", "args", "timeout"}
NPD_CONDITION_KEYS = {"type", "reason", "message"}


def npd_config(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the plugin monitor config, the ConfigMap holding it)."""
    (cm,) = [d for d in by_kind(docs, "ConfigMap")
             if d["metadata"]["name"].endswith("-node-problem-detector")]
    return json.loads(cm["data"]["gpu-health.json"]), cm


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    number, unit = duration.rstrip("smh"), duration[len(duration.rstrip("smh")):]
    return float(number) * units[unit]


def test_node_problem_detector_is_off_by_default(helm):
    docs = objects(helm, {})
    assert not any(d["metadata"]["name"].endswith("-node-problem-detector") for d in docs)
    pod = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["exporter"]
    assert "serviceAccountName" not in pod and "initContainers" not in pod


def test_node_problem_detector_config_is_what_it_reads_and_wired_in_the_pod(helm):
    docs = objects(helm, VALUES_SETS["node-problem-detector"])
    config, cm = npd_config(docs)
    assert set(config) <= NPD_KEYS and set(config["pluginConfig"]) <= NPD_PLUGIN_KEYS
    assert config["plugin"] == "custom"
    (condition,) = config["conditions"]
    assert set(condition) <= NPD_CONDITION_KEYS and condition["type"] == "GpuUnhealthy"
    (rule,) = config["rules"]
    assert set(rule) <= NPD_RULE_KEYS
    assert (rule["type"], rule["condition"]) == ("permanent", "GpuUnhealthy")
    # node-problem-detector refuses a rule timeout above the global one
    assert _seconds(rule["timeout"]) <= _seconds(config["pluginConfig"]["timeout"]) < (
        _seconds(config["pluginConfig"]["invoke_interval"]))
    assert rule["args"] == [
        "health", "--web.listen-address=127.0.0.1:9955",
        "--web.config.file=/etc/cluster-telemetry-exporter/web/web-config.yml",
        "--fail-on=warning", "--auth.username=npd",
        "--auth.password-file=/etc/cluster-telemetry-exporter/npd-auth/password"]
    # the plugin is our image's entry point (the Containerfile's virtual environment)
    containerfile = (REPO / "deploy" / "container" / "Containerfile").read_text()
    assert "python3 -m venv /opt/cte" in containerfile
    assert rule["path"] == "/opt/cte/bin/cluster-telemetry-exporter"

    pod = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    npd = next(c for c in pod["containers"] if c["name"] == "node-problem-detector")
    assert npd["image"] == container(docs)["image"]  # the plugin runs from our image
    (copy,) = pod["initContainers"]
    assert copy["image"].startswith("registry.k8s.io/node-problem-detector/")
    assert copy["command"][-1] == npd["command"][0] == "/npd/node-problem-detector"
    mounts = {m["name"]: m["mountPath"] for m in npd["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    flag = next(a for a in npd["command"] if a.startswith("--config.custom-plugin-monitor="))
    assert flag.split("=", 1)[1] == mounts["npd-config"] + "/gpu-health.json"
    assert volumes["npd-config"]["configMap"]["name"] == cm["metadata"]["name"]
    assert mounts["web-config"] == "/etc/cluster-telemetry-exporter/web"
    assert mounts["npd-auth"] + "/password" == rule["args"][-1].split("=", 1)[1]
    assert volumes["npd-auth"]["secret"]["secretName"] == "npd"
    # the API token only in node-problem-detector's container, its account bound to
    # Kubernetes' own role for it
    assert pod["automountServiceAccountToken"] is False
    assert mounts["npd-token"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    assert "npd-token" not in {m["name"] for m in container(docs)["volumeMounts"]}
    binding = only(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "system:node-problem-detector"
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"] == (
        only(docs, "ServiceAccount")["metadata"]["name"])
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in (
        npd["env"])


def test_node_problem_detector_plugin_command_runs(helm, running_exporter):
    """The rendered rule's command, run as node-problem-detector runs it (its path is our
    image's entry point; here the one installed with this checkout), against real
    exporters: 1 for a lost GPU, 0 for a healthy node, 2 once the exporter is gone, one
    line within max_output_length each time."""
    entry_point = str(Path(sys.executable).parent / "cluster-telemetry-exporter")
    for scenario, expected in (("gpu-lost", 1), ("training", 0)):
        exporter = running_exporter.start(manual=True, scenario=scenario)
        exporter.sampler.advance(16)
        config, _ = npd_config(objects(helm, {"nodeProblemDetector": {"enabled": True},
                                               "port": exporter.port}))
        (rule,) = config["rules"]
        result = subprocess.run([entry_point, *rule["args"]], capture_output=True, text=True,
                                timeout=_seconds(rule["timeout"]) * 3)
        assert result.returncode == expected, result.stdout + result.stderr
        assert result.stdout.count("\n") == 1
        assert len(result.stdout) <= config["pluginConfig"]["max_output_length"]
    running_exporter.stop_all()
    result = subprocess.run([entry_point, *rule["args"]], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and result.stdout.startswith("unknown: cannot reach")
