"""End to end: the sharded deployment of deploy/scale against one Prometheus.

`simulate --scenario sharded` runs 32 nodes: two jobs of 16 stepping in phase (one
coherent swing over the whole cluster) and a straggler on node 5 GPU 3. Two vmagent
shards split the nodes and remote-write into VictoriaMetrics; vmalert evaluates the
node-local files and, separately, alerts/global-*.yml against it and writes the results
back; alerts go to a real Alertmanager. One Prometheus scrapes every node and loads every
rule file: the reference. The test shows
- the shards split the nodes, and each job has nodes on both;
- the global straggler alert (GpuJobOutlier) fires for node 5 GPU 3 and reaches
  Alertmanager, and the cluster's coherent swing alert fires;
- the `hpc_job:` and `cluster:` recording rules agree with the reference within 2 %;
- the same job and cluster rules evaluated on one shard's nodes alone are wrong: half the
  GPUs, half the swing, below the threshold the whole cluster is above.

The rule files are copies of alerts/*.yml with `for:` cut to 5 s (the expressions are the
shipped ones) and a swing threshold of 75 kW for the test's cluster: its coherent swing is
about 90 kW (each job of 16 nodes about 64 kW, in two frequency buckets, as the straggler
slows job 5001's steps), and the smaller shard's part of it at most about 64 kW. The
simulator runs at the low rates bench/fleet_prometheus.py uses (power at 2 Hz, a 5 s sweep)
so 32 nodes fit on 2 CPUs.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from bench.scale_stack import BINARIES, ScaleStack, copy_rules, get_json, query
from tests.prom import Prometheus
from tests.tools import REPO, free_base_port, require_binary

NODES = 32
CLUSTER = "sim"
THRESHOLD_WATTS = 75000
INTERVAL = "5s"
STRAGGLER = (5, "3", "5001")  # node, gpu, job
# Global recording rules compared with the reference, averaged over a minute (the two
# scrape the same exporters at different instants). Left out: the instant power sums (a
# 2 s step waveform read at different instants: a few % apart) and the `:avg5m` rates,
# which differ between the two engines until the series is older than the 5 m window
# (Prometheus divides by the whole window, VictoriaMetrics by the time the samples span).
COMPARED = (
    "cluster:gpus_up:sum", "cluster:gpus_expected:sum", "cluster:gpu_utilization_ratio:sum",
    "hpc_job:gpu_utilization_ratio:sum",
    "cluster:power_swing_amplitude_watts:sum",
    "cluster:power_swing_coherent_amplitude_watts:estimate",
    "cluster:power_swing_phase_coherence:ratio", "cluster:power_ramp_watts_per_second:sum",
    "hpc_job:power_swing_amplitude_watts:sum",
    "hpc_job:power_swing_phase_coherence:ratio",
    "hpc_job:power_swing_coherent_amplitude_watts:estimate",
    "hpc_job:power_ramp_watts_per_second:sum", "hpc_job:gpu_window_feature:median",
    "hpc_job:gpu_window_feature:count",
)
TOLERANCE = 0.02


def _edit(name: str, text: str) -> str:
    """Short `for:`; the test cluster's swing threshold."""
    text = re.sub(r"(\n\s+for: )\d+[smh]\b", r"\g<1>5s", text)
    if name != "global-power.yml":
        return text
    data = yaml.safe_load(text)
    config = next(g for g in data["groups"] if g["name"] == "power-config")
    config["rules"].append({"record": "cluster:power_swing_coherent_amplitude_watts:threshold",
                            "expr": f"vector({THRESHOLD_WATTS})", "labels": {"cluster": CLUSTER}})
    return yaml.safe_dump(data, sort_keys=False)


def _rule_expr(record: str) -> str:
    for path in (REPO / "alerts").glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if rule.get("record") == record:
                    return rule["expr"]
    raise KeyError(record)


class World:
    def __init__(self, workdir):
        for name in BINARIES:
            require_binary(name)
        self.procs = []
        base = free_base_port(NODES)
        self.targets = [f"127.0.0.1:{base + i}" for i in range(NODES)]
        rules = copy_rules(workdir / "rules", _edit)
        labels = {"cluster": CLUSTER}
        self.prom = Prometheus(
            workdir, [], scrape_interval=INTERVAL, evaluation_interval=INTERVAL,
            rule_files=[str(p) for p in sorted(rules.glob("*.yml"))],
            scrape_configs=[{"job_name": "gpu-nodes", "static_configs": [
                {"targets": self.targets, "labels": labels}]}])
        self.stack = None
        try:
            self.stack = ScaleStack(workdir, self.targets, labels, rules,
                                    scrape_interval=INTERVAL, evaluation_interval=INTERVAL)
            self.sim = subprocess.Popen(
                [sys.executable, "-m", "exporter", "simulate", "--scenario", "sharded",
                 "--nodes", str(NODES), "--base-port", str(base),
                 "--power.sample-rate", "2", "--sweep.interval", "5",
                 "--straggler.persistence", "10", "--log.level", "error"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.procs.append(self.sim)
            line, deadline = "", time.monotonic() + 120
            while "127.0.0.1" not in line and time.monotonic() < deadline:
                line = self.sim.stdout.readline()
                if not line and self.sim.poll() is not None:
                    raise RuntimeError("simulate exited")
            assert line.split() == self.targets, line
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        if self.stack:
            self.stack.stop()
        self.prom.stop()
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("scale"))
    try:
        yield w
    finally:
        w.stop()


def _until(probe: Callable[[], object], timeout: float, interval: float = 2.0):
    """probe() until it returns (value, True); the last value either way."""
    deadline = time.monotonic() + timeout
    while True:
        value, ok = probe()
        if ok or time.monotonic() > deadline:
            return value, ok
        time.sleep(interval)


def _key(metric: dict) -> tuple:
    """The labels a global rule keeps (VictoriaMetrics keeps the name where Prometheus drops it)."""
    return tuple(sorted((k, v) for k, v in metric.items() if k in {
        "cluster", "hpc_job", "signal", "frequency_bucket"}))


def _values(base: str, expr: str, **params) -> dict[tuple, float]:
    return {_key(r["metric"]): float(r["value"][1]) for r in query(base, expr, **params)}


@pytest.mark.e2e
def test_every_service_runs_under_its_units_hardening(world):
    """The store, the shards and the rulers serve (the tests below) with no privileges left
    and the file system read-only, but for the store's and the shards' state directory."""
    data = str(world.stack.workdir / "data")
    for name, pid in world.stack.pids.items():
        if name == "alertmanager":  # not one of our units
            continue
        status = dict(line.split(":\t", 1) for line in
                      Path(f"/proc/{pid}/status").read_text().splitlines())
        assert (status["NoNewPrivs"], status["CapBnd"], status["CapEff"], status["Umask"]) == (
            "1", "0000000000000000", "0000000000000000", "0077"), name
        mounts = {fields[4]: fields[5].split(",") for fields in (
            line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines())}
        assert "ro" in mounts["/"], name
        if name.startswith("vmalert"):
            assert data not in mounts, name  # nothing writable
        else:
            assert "rw" in mounts[data], name


@pytest.mark.e2e
def test_shards_split_the_nodes_and_each_job_spans_both(world):
    shards, ok = _until(lambda: (s := world.stack.shard_targets(),
                                 sum(map(len, s)) == NODES), 60)
    assert ok, shards
    zero, one = shards
    assert zero and one and not zero & one and zero | one == set(world.targets)
    jobs = {"5001": set(world.targets[:16]), "5002": set(world.targets[16:])}
    for job, nodes in jobs.items():
        assert nodes & zero and nodes & one, (job, shards)


@pytest.mark.e2e
def test_global_alerts_fire_in_vmalert_and_reach_alertmanager(world):
    node, gpu, job = STRAGGLER
    instance = world.targets[node]

    def outliers():
        alerts = [a for a in world.stack.vmalert_alerts(world.stack.vmalert_global)
                  if a["state"] == "firing"]
        names = {(a["name"], a["labels"].get("instance"), a["labels"].get("gpu"),
                  a["labels"].get("hpc_job")) for a in alerts}
        want = {("GpuJobOutlier", instance, gpu, job),
                ("ClusterPowerSwingCoherent", None, None, None)}
        return names, want <= names

    names, ok = _until(outliers, 420)
    assert ok, (names, world.stack.log("vmalert-global")[-3000:])
    # every rule of both rulers evaluates without error: every shipped rule, and the
    # threshold this test adds
    for base in (world.stack.vmalert_node, world.stack.vmalert_global):
        assert world.stack.rule_errors(base) == {}, base
    shipped = sum(len(g["rules"]) for p in (REPO / "alerts").glob("*.yml")
                  for g in yaml.safe_load(p.read_text())["groups"])
    assert sum(len(world.stack.rules(b)) for b in (world.stack.vmalert_node,
                                                    world.stack.vmalert_global)) == shipped + 1
    # the outlier is that GPU alone, and only the global ruler has job-level alerts
    assert {n[1:] for n in names if n[0] == "GpuJobOutlier"} == {(instance, gpu, job)}
    node_alerts = {a["name"] for a in world.stack.vmalert_alerts(world.stack.vmalert_node)}
    assert not node_alerts & {"GpuJobOutlier", "ClusterPowerSwingCoherent"}

    def in_alertmanager():
        got = {(a["labels"]["alertname"], a["labels"].get("instance"), a["labels"].get("gpu"))
               for a in get_json(f"{world.stack.alertmanager}/api/v2/alerts")}
        return got, ("GpuJobOutlier", instance, gpu) in got

    got, ok = _until(in_alertmanager, 60)
    assert ok, got


@pytest.mark.e2e
def test_recording_rules_agree_with_one_prometheus(world):
    prom = f"http://127.0.0.1:{world.prom.port}"

    def compare():
        diffs, missing = {}, []
        for name in COMPARED:
            expr = f"avg_over_time({name}[1m])"
            ours, ref = _values(world.stack.vm, expr), _values(prom, expr)
            if not ref or ours.keys() != ref.keys():
                missing.append((name, sorted(ref), sorted(ours)))
                continue
            for key, want in ref.items():
                got = ours[key]
                if not math.isclose(got, want, rel_tol=TOLERANCE, abs_tol=1e-9):
                    diffs[(name, key)] = (got, want)
        return (diffs, missing), not diffs and not missing

    (diffs, missing), ok = _until(compare, 240, interval=5)
    assert ok, {"differ": diffs, "missing": missing}


@pytest.mark.e2e
def test_a_job_rule_on_one_shard_alone_is_wrong(world):
    """What a shard would compute: the same expressions over its own nodes only."""
    shard = min(world.stack.shard_targets(), key=len)  # the smaller shard
    only = {"extra_filters[]": '{instance=~"' + "|".join(sorted(shard)) + '"}'}
    vm = world.stack.vm
    count = "hpc_job:gpu_window_feature:count"

    def counts():
        # a node whose straggler window is held (sampled badly: the fleet shares two CPUs
        # with the store and the rulers) serves no window features for that update, so
        # one instant may lack a few GPUs: wait for one where every GPU is counted
        whole = _values(vm, count + '{signal="sm_clock"}')
        alone = {k: v for k, v in _values(vm, _rule_expr(count), **only).items()
                 if ("signal", "sm_clock") in k}
        complete = len(whole) == 2 and set(whole) == set(alone) and all(
            v == 128 for v in whole.values())
        return (whole, alone), complete

    (whole, alone), complete = _until(counts, 120, interval=5)
    if not complete:
        # the exporters say why: they sampled their windows too badly to judge (a starved
        # fleet, 32 nodes in one process on a loaded machine). Anything else still fails.
        held = _values(vm, "sum(gpu_node_straggler_analysis_held)")
        if sum(held.values()) > 0:
            pytest.skip(f"{sum(held.values()):.0f} nodes hold their straggler windows "
                        f"(sampled badly under load): the count cannot be judged {whole}")
    jobs = {"5001": world.targets[:16], "5002": world.targets[16:]}
    assert set(whole) == set(alone) and len(whole) == 2, (whole, alone)
    for key, gpus in whole.items():
        nodes = len(shard & set(jobs[dict(key)["hpc_job"]]))
        assert gpus == 128 and alone[key] == 8 * nodes < 128, (key, gpus, alone)

    swing = "cluster_frequency_bucket:power_swing_coherent_amplitude_watts:estimate"
    whole_swing = math.hypot(*_values(vm, swing).values())
    alone_swing = math.hypot(*_values(vm, _rule_expr(swing), **only).values())
    assert whole_swing > THRESHOLD_WATTS > alone_swing > 0, (whole_swing, alone_swing)
    assert alone_swing < 0.75 * whole_swing, (whole_swing, alone_swing)
