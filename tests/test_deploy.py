"""deploy/: every systemd unit's hardening, the example config, Prometheus and Kubernetes files
(the plain manifests, rendered from the Helm chart; the chart itself: test_helm_chart.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from tests.tools import REPO, require_binary

DEPLOY = REPO / "deploy"
UNIT = DEPLOY / "systemd" / "cluster-telemetry-exporter.service"
PORT = 9955


UNITS = sorted(DEPLOY.rglob("*.service"))


def test_every_systemd_unit_is_found():
    names = {unit.relative_to(DEPLOY).as_posix() for unit in UNITS}
    assert {"systemd/cluster-telemetry-exporter.service", "scale/victoria-metrics.service",
            "scale/vmagent@.service", "scale/vmalert-global.service",
            "scale/vmalert-node.service"} <= names


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_systemd_unit_exposure_is_at_most_2(unit):
    analyze = require_binary("systemd-analyze")
    result = subprocess.run([analyze, "security", "--offline=true", "--no-pager", str(unit)],
                            capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", output)
    assert found, output
    assert float(found.group(1)) <= 2.0, output


def test_systemd_unit_essentials():
    text = UNIT.read_text()
    settings = {line for line in text.splitlines() if line and not line.startswith("#")}
    for line in ("DynamicUser=yes", "Restart=on-failure", "DevicePolicy=closed",
                 "DeviceAllow=/dev/nvidiactl rw", "DeviceAllow=char-nvidia* rw",
                 "ProtectSystem=strict", "NoNewPrivileges=yes",
                 # the state directory, and the kernel log's one capability
                 "StateDirectory=cluster-telemetry-exporter\n",
                 "CapabilityBoundingSet=CAP_SYSLOG\n", "DeviceAllow=/dev/kmsg r\n",
                 "--config /etc/cluster-telemetry-exporter/config.yaml",
                 # SIGHUP reloads; sd_notify readiness and watchdog (exporter/service.py)
                 "ExecReload=/bin/kill -HUP $MAINPID", "Type=notify", "WatchdogSec="):
        assert line in text, line
    assert "PrivateDevices=no" in settings  # yes would hide /dev/nvidia*
    assert "ProcSubset=pid" not in settings  # NVML reads /proc/driver/nvidia


def test_example_config_passes_check_config():
    result = subprocess.run([sys.executable, "-m", "exporter", "check-config",
                             str(DEPLOY / "config.yaml")], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    assert "listen :9955" in result.stdout


def test_prometheus_example_passes_promtool():
    promtool = require_binary("promtool")
    config = DEPLOY / "prometheus" / "prometheus.yml"
    result = subprocess.run([promtool, "check", "config", str(config)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    parsed = yaml.safe_load(config.read_text())
    assert parsed["rule_files"] == ["../../alerts/*.yml"]
    # promtool checked the shipped rules through the glob, not an empty match
    assert "SUCCESS: " in result.stdout and "rules found" in result.stdout, result.stdout
    assert "recording.yml" in result.stdout, result.stdout
    sd = parsed["scrape_configs"][0]["file_sd_configs"][0]["files"]
    assert sd == ["targets/gpu-nodes.yml"]
    targets = yaml.safe_load((DEPLOY / "prometheus" / sd[0]).read_text())
    assert all(t.endswith(f":{PORT}") for group in targets for t in group["targets"])


def load_kube(name: str) -> dict:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]
    assert len(docs) == 1
    return docs[0]


def test_kubernetes_daemonset_service_and_servicemonitor_fit_together():
    ds, svc, sm = (load_kube(n) for n in ("daemonset.yaml", "service.yaml",
                                          "servicemonitor.yaml"))
    assert (ds["apiVersion"], ds["kind"]) == ("apps/v1", "DaemonSet")
    assert (svc["apiVersion"], svc["kind"]) == ("v1", "Service")
    assert (sm["apiVersion"], sm["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")

    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert ds["metadata"]["namespace"] == svc["metadata"]["namespace"] == (
        sm["metadata"]["namespace"])

    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    (container,) = pod["containers"]
    image = container["image"]
    assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": PORT}
    # liveness on /healthz (the exporter itself), readiness on /readyz (503 only while
    # it serves no fresh data; a hung GPU keeps it in the endpoints)
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path and ports.get(get["port"], get["port"]) == PORT
    resources = container["resources"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= resources[kind].keys()
    assert resources["limits"]["memory"] == "192Mi"  # measured RSS 72-77 MB steady

    # the host's /sys read-only at /host/sys: /sys/class/infiniband's entries are links
    # into /sys/devices, which a mount of the class directory alone would break
    host_paths = {v["hostPath"]["path"]: v["name"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[host_paths["/sys"]] == "/host/sys"
    assert "--path.sysfs=/host/sys" in container["args"]
    # the kubelet's pod-resources socket, where the kubernetes collector looks for it
    from exporter.collectors.kubernetes.spec import DEFAULT_SOCKET

    assert mounts[host_paths["/var/lib/kubelet/pod-resources"]] == os.path.dirname(
        DEFAULT_SOCKET)
    assert f"--kubernetes.pod-resources-socket={DEFAULT_SOCKET}" in container["args"]

    (svc_port,) = svc["spec"]["ports"]
    assert svc_port["port"] == PORT and svc_port["targetPort"] in (PORT, "metrics")
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == svc_port["name"] and endpoint["path"] == "/metrics"
