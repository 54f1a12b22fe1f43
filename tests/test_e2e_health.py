"""End to end: a real Prometheus scrapes two `run --fake` nodes, one whose GPU 5 falls off
the bus (scenario gpu-lost) and a healthy one, with alerts/gpu-hardware.yml loaded (its
`for:` cut to 2 s). GpuHealthFailed fires for the lost GPU with the action it needs in
its labels and summary, and never for the healthy node; the global rules count the GPUs
by verdict."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
import yaml

from tests.prom import Prometheus
from tests.tools import REPO, free_port, stop_process, wait_for


def short_rules(workdir) -> list[str]:
    out = []
    for name in ("gpu-hardware.yml", "global-recording.yml", "recording.yml"):
        text = re.sub(r"(\n\s+for: )\d+[smh]\b", r"\g<1>2s", (REPO / "alerts" / name).read_text())
        target = workdir / name
        target.write_text(yaml.safe_dump(yaml.safe_load(text), sort_keys=False))
        out.append(str(target))
    return out


@pytest.fixture
def nodes():
    procs, ports = [], []
    try:
        for scenario in ("gpu-lost", "training"):
            port = free_port()
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "exporter", "run", "--fake", "--scenario", scenario,
                 "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "error"],
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
            ports.append(port)
        yield ports, procs
    finally:
        for proc in procs:
            stop_process(proc)


@pytest.mark.e2e
def test_gpu_health_failed_fires_with_the_action_and_a_healthy_node_fires_none(tmp_path,
                                                                                nodes):
    (failing, healthy), procs = nodes
    scrape = [{"job_name": "gpu", "static_configs": [{
        "targets": [f"127.0.0.1:{failing}", f"127.0.0.1:{healthy}"],
        "labels": {"cluster": "c1"}}]}]
    prom = Prometheus(tmp_path, [], scrape_interval="1s", evaluation_interval="1s",
                      rule_files=short_rules(tmp_path), scrape_configs=scrape)
    try:
        def fired():
            return [a for a in prom.api("alerts")["alerts"]
                    if a["labels"]["alertname"] == "GpuHealthFailed" and a["state"] == "firing"]

        # the GPU is lost 10 s into the scenario; the exporters start in a few seconds
        alerts = wait_for(fired, timeout=120, interval=0.5)
        assert [(a["labels"]["instance"], a["labels"]["gpu"], a["labels"]["action"])
                for a in alerts] == [(f"127.0.0.1:{failing}", "5", "reboot_node")]
        assert alerts[0]["annotations"]["summary"].startswith(
            f"GPU 5 on 127.0.0.1:{failing} needs reboot_node: GPU 5: GPU lost")
        assert alerts[0]["labels"]["severity"] == "critical"
        # the healthy node: every GPU ok, nothing pending or firing for it
        time.sleep(3)
        ok = prom.query(f'gpu_health_state{{instance="127.0.0.1:{healthy}", state="ok"}} == 1')
        assert len(ok) == 8
        quiet = [a for a in prom.api("alerts")["alerts"]
                 if a["labels"].get("instance") == f"127.0.0.1:{healthy}"
                 and a["labels"]["alertname"] == "GpuHealthFailed"]
        assert quiet == []
        want = {"ok": 15.0, "warning": 0.0, "failed": 1.0}

        def counts():
            return {r["metric"]["state"]: float(r["value"][1])
                    for r in prom.query('cluster:gpu_health_gpus:sum{cluster="c1"}')}

        assert wait_for(lambda: counts() == want and counts(), timeout=30) == want
    finally:
        prom.stop()
    assert all(proc.poll() is None for proc in procs)
