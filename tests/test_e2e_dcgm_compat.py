"""End to end: a real Prometheus scrapes a fake node in dcgm-exporter compatibility mode
and answers queries written the way dcgm-exporter's users write them: dashboard panels,
an OpenCost-style GPU utilisation by container (pods from the fake kubelet), the
autoscaler's query on DCGM_FI_DEV_GPU_UTIL (KEDA's Prometheus scaler, prometheus-adapter)
and an alert on DCGM_FI_DEV_XID_ERRORS that names err_code.

The queries are our own, written from dcgm-exporter's documented names, units and
labels; none is copied from another project.
"""

from __future__ import annotations

import pytest
import yaml

from exporter.sim.physics import gpu_uuid
from tests.prom import Prometheus
from tests.tools import require_module, wait_for

grpc = require_module("grpc")
from tests.fake_kubelet import FakeKubelet, Holding  # noqa: E402

pytestmark = pytest.mark.e2e

UUIDS = [gpu_uuid(1, i) for i in range(8)]  # the fake's GPUs (seed 1)

XID_RULES = {"groups": [{"name": "dcgm-xid", "rules": [{
    "alert": "GpuXidError",
    # fires for every GPU whose last XID is a real one; err_code says which
    "expr": 'DCGM_FI_DEV_XID_ERRORS{err_code!="0"} > 0',
    "labels": {"severity": "critical"},
    "annotations": {"summary": "XID {{ $labels.err_code }} ({{ $labels.err_msg }}) on "
                               "{{ $labels.Hostname }} GPU {{ $labels.gpu }}"}}]}]}


@pytest.fixture(scope="module")
def prom(module_exporter, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dcgm")
    kubelet = FakeKubelet(str(tmp / "k.sock"), [
        Holding("team-a", "llama-0", "trainer", "nvidia.com/gpu", (UUIDS[0], UUIDS[1])),
        Holding("team-b", "bert-7", "worker", "nvidia.com/gpu", (UUIDS[3],))]).start()
    server = None
    try:
        exp = module_exporter.start(scenario="xid", metrics_compat="dcgm-exporter",
                                    kubernetes_pod_resources_socket=kubelet.path,
                                    kubernetes_refresh_interval_seconds=1.0,
                                    energy_interval_seconds=1.0)
        rules = tmp / "dcgm-alerts.yml"
        rules.write_text(yaml.safe_dump(XID_RULES))
        server = Prometheus(tmp, [f"127.0.0.1:{exp.port}"], rule_files=[str(rules)])
        yield server
    finally:
        if server is not None:
            server.stop()
        kubelet.stop()


def values(prom: Prometheus, expr: str, want: int, timeout: float = 60) -> dict:
    """{labels: value} of a query once it has `want` series."""
    def got() -> dict:
        result = {tuple(sorted(s["metric"].items())): float(s["value"][1])
                  for s in prom.query(expr)}
        return result if len(result) == want else {}
    return wait_for(got, timeout=timeout)


def test_dashboard_panels(prom):
    # temperature and power per GPU, as a node panel draws them
    temps = values(prom, "max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP)", 8)
    assert all(20 < t < 100 for t in temps.values())  # C, not K or mC
    power = values(prom, "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)", 1)
    assert 8 * 60 < next(iter(power.values())) < 8 * 800  # W, on 8 H100s
    # framebuffer in use as a share: two families joined without on()
    used = values(prom, "DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)", 8)
    assert all(0 < share <= 1 for share in used.values())
    # the energy counter in mJ: its rate / 1000 is watts, the power panel's figure
    values(prom, "count_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[10s]) >= 8", 8)
    ratio = values(prom, "sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[10s])) / 1000"
                         " / sum(avg_over_time(DCGM_FI_DEV_POWER_USAGE[10s]))", 1)
    assert 0.5 < next(iter(ratio.values())) < 1.5
    clocks = values(prom, "avg(DCGM_FI_DEV_SM_CLOCK)", 1)
    assert 500 < next(iter(clocks.values())) < 2500  # MHz


def test_utilisation_by_container_as_cost_tools_ask(prom):
    by_container = values(
        prom, 'avg by (namespace, pod, container) '
              '(avg_over_time(DCGM_FI_DEV_GPU_UTIL{container!=""}[1m]))', 2)
    keys = {dict(k)["pod"]: dict(k) for k in by_container}
    assert keys["llama-0"]["namespace"] == "team-a" and keys["llama-0"]["container"] == "trainer"
    assert keys["bert-7"]["namespace"] == "team-b"
    assert all(0 <= v <= 100 for v in by_container.values())  # %, not a ratio
    # GPUs held, per pod: one series per GPU, so count() counts devices
    held = values(prom, 'count by (pod) (DCGM_FI_DEV_GPU_UTIL{pod!=""})', 2)
    assert {dict(k)["pod"]: v for k, v in held.items()} == {"llama-0": 2.0, "bert-7": 1.0}


def test_autoscaler_query_on_gpu_util(prom):
    # KEDA's Prometheus scaler and prometheus-adapter both take one number per workload
    util = values(prom, 'avg(DCGM_FI_DEV_GPU_UTIL{namespace="team-a", pod=~"llama-.*"})', 1)
    assert 50 <= next(iter(util.values())) <= 100  # a training job keeps its GPUs busy
    per_pod = values(prom, 'sum by (namespace, pod) '
                           '(DCGM_FI_DEV_GPU_UTIL{namespace!="", pod!=""}) / 100', 2)
    assert all(0 <= v <= 2 for v in per_pod.values())


def test_xid_alert_names_the_error(prom):
    firing = values(prom, 'ALERTS{alertname="GpuXidError", alertstate="firing"}', 6,
                    timeout=90)
    codes = {dict(k)["gpu"]: dict(k)["err_code"] for k in firing}
    # the scenario's XIDs: each GPU's last one (GPU 2 had 94, then 48)
    assert codes == {"1": "13", "2": "48", "3": "95", "4": "119", "5": "79", "6": "999"}
    messages = {dict(k)["err_code"]: dict(k)["err_msg"] for k in firing}
    assert messages["79"] == "GPU has fallen off the bus"
