"""End to end: `simulate` fleets scraped by a real Prometheus that loads alerts/.

Three fleets run at once, each labelled with its own `cluster`: `faults` (one big job plus
injected faults), `two-jobs` (two independent jobs) and `healthy`. The rule files are
copies of alerts/*.yml with `for:` durations of 10 minutes or less cut to 10 s (the
expressions are the shipped ones), plus a per-cluster swing threshold of 25 kW for the
faults and two-jobs fleets (the documented way to set a cluster's threshold): 8 nodes
in phase swing about 30 kW, two jobs of 4 nodes at different step rates about 22 kW.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import pytest
import yaml

from tests.prom import Prometheus
from tests.tools import REPO

NODES = 8
TEST_THRESHOLD_WATTS = 25000


def _free_base_port(count: int) -> int:
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            socks = []
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


def shortened_rules(workdir) -> list[str]:
    """Copies of alerts/*.yml with short `for:` and the test's per-cluster thresholds."""
    out = []
    for path in sorted((REPO / "alerts").glob("*.yml")):
        text = path.read_text()

        def shorten(match: re.Match) -> str:
            value, unit = int(match.group(2)), match.group(3)
            seconds = value * {"s": 1, "m": 60, "h": 3600}[unit]
            return f"{match.group(1)}10s" if seconds <= 600 else match.group(0)

        text = re.sub(r"(\n\s+for: )(\d+)([smh])\b", shorten, text)
        data = yaml.safe_load(text)
        if path.name == "power.yml":
            config = next(g for g in data["groups"] if g["name"] == "power-config")
            for cluster in ("faults", "two-jobs"):
                config["rules"].append({
                    "record": "cluster:power_swing_coherent_amplitude_watts:threshold",
                    "expr": f"vector({TEST_THRESHOLD_WATTS})", "labels": {"cluster": cluster}})
        target = workdir / path.name
        target.write_text(yaml.safe_dump(data, sort_keys=False))
        out.append(str(target))
    return out


@pytest.fixture
def fleets():
    procs, bases = {}, {}
    try:
        for name in ("faults", "two-jobs", "healthy"):
            base = _free_base_port(NODES)
            bases[name] = base
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "exporter", "simulate", "--scenario", name,
                 "--nodes", str(NODES), "--base-port", str(base),
                 "--straggler.persistence", "20", "--log.level", "error"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            # the simulator prints its targets once every node serves
            line = ""
            deadline = time.monotonic() + 60
            while "127.0.0.1" not in line and time.monotonic() < deadline:
                line = procs[name].stdout.readline()
                if not line and procs[name].poll() is not None:
                    raise RuntimeError(f"simulate {name} exited")
            assert line.split() == [f"127.0.0.1:{base + i}" for i in range(NODES)], line
        yield bases
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _alerts(prom: Prometheus) -> list[dict]:
    return [a for a in prom.api("alerts")["alerts"] if a["state"] == "firing"]


def _has(alerts, name, **labels) -> bool:
    return any(a["labels"]["alertname"] == name
               and all(a["labels"].get(k) == v for k, v in labels.items()) for a in alerts)


@pytest.mark.e2e
def test_fleet_alerts_through_prometheus(tmp_path, fleets):
    scrape = [{"job_name": f"gpu-{name}", "static_configs": [{
        "targets": [f"127.0.0.1:{base + i}" for i in range(NODES)],
        "labels": {"cluster": name}}]} for name, base in fleets.items()]
    prom = Prometheus(tmp_path, [], scrape_interval="2s", evaluation_interval="2s",
                      rule_files=shortened_rules(tmp_path), scrape_configs=scrape)
    node = {name: [f"127.0.0.1:{base + i}" for i in range(NODES)]
            for name, base in fleets.items()}
    f = node["faults"]
    expected = [
        ("GpuLost", {"instance": f[7], "gpu": "2"}),
        ("GpuXidCritical", {"instance": f[7], "gpu": "2", "xid": "79"}),
        ("GpuXidCritical", {"instance": f[5], "gpu": "1", "xid": "48"}),
        ("GpuEccUncorrectable", {"instance": f[5], "gpu": "1"}),
        ("GpuRecoveryActionRequired", {"instance": f[5], "gpu": "1", "action": "gpu_reset"}),
        ("GpusBelowExpected", {"instance": f[7]}),
        ("InfinibandPortDown", {"instance": f[2], "device": "mlx5_0", "port": "1"}),
        ("InfinibandLinkDowned", {"instance": f[2], "device": "mlx5_0", "port": "1"}),
        ("InfinibandSymbolErrorRate", {"instance": f[4], "device": "mlx5_1"}),
        ("GpuHardwareThrottling", {"instance": f[6], "gpu": "0",
                                   "reason": "hw_thermal_slowdown"}),
        ("GpuNvlinkInactive", {"instance": f[1], "gpu": "4"}),
        ("GpuStraggler", {"instance": f[3], "gpu": "5"}),
        ("GpuJobOutlier", {"instance": f[3], "gpu": "5", "hpc_job": "2001",
                           "signal": "sm_clock"}),
        ("ClusterPowerSwingCoherent", {"cluster": "faults"}),
    ]
    try:
        deadline = time.monotonic() + 150
        while True:
            alerts = _alerts(prom)
            missing = [(n, labels) for n, labels in expected if not _has(alerts, n, **labels)]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(3)
        assert not missing, (missing, [a["labels"] for a in alerts])
        # every fault alert is where it was injected: nothing on the fault-free nodes 0
        faults_nodes = {a["labels"].get("instance") for a in alerts
                        if a["labels"].get("cluster") == "faults"}
        assert f[0] not in faults_nodes
        # the big job is coherent; the two independent jobs each are, but not together
        coherence = {r["metric"]["hpc_job"]: float(r["value"][1])
                     for r in prom.query("hpc_job:power_swing_phase_coherence:ratio")}
        assert coherence["2001"] > 0.9 and coherence["3001"] > 0.9 and coherence["3002"] > 0.9
        estimate = {r["metric"]["cluster"]: float(r["value"][1]) for r in
                    prom.query("cluster:power_swing_coherent_amplitude_watts:estimate")}
        assert estimate["faults"] > TEST_THRESHOLD_WATTS > estimate["two-jobs"], estimate
        assert not _has(alerts, "ClusterPowerSwingCoherent", cluster="two-jobs")
        # the healthy fleet: nothing firing; pending only the informational swing notice
        # (every training node swings; it would fire after its 30 minutes), every GPU up
        healthy = [a for a in prom.api("alerts")["alerts"]
                   if a["labels"].get("cluster") == "healthy"]
        assert [a["labels"] for a in healthy if a["state"] == "firing"] == []
        assert {a["labels"]["alertname"] for a in healthy} <= {"NodePowerSwingSustained"}
        up = prom.query('cluster:gpus_up:sum{cluster="healthy"}')
        assert float(up[0]["value"][1]) == NODES * 8
        for name in ("hpc_job:gpu_power_watts:sum", "hpc_job:power_ramp_watts_per_second:sum",
                     "cluster:power_ramp_watts_per_second:sum", "cluster:gpus_expected:sum"):
            assert prom.query(name), name
    finally:
        prom.stop()
