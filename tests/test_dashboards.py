"""Grafana dashboards: shape, metric names, PromQL syntax, and data from a real Prometheus.

The live part starts a small fleet of fake exporters (training with jobs and InfiniBand,
a straggler, a lost GPU, NVLink errors) in two clusters, scrapes them every second with a
real Prometheus that loads any `alerts/*.yml` in the repository, and runs every panel's
first query with the template variables filled in.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from exporter.sim.ib_tree import down_hca, ndr_hca, roce_hca
from exporter.sim.physics import gpu_uuid
from exporter.sim.scenarios import load_scenario
from tests.prom import Prometheus
from tests.tools import (
    REPO,
    free_port,
    require_binary,
    require_module,
    stop_process,
    wait_for,
)

DASHBOARDS = REPO / "dashboards"
EXPECTED_FILES = ["cluster-overview.json", "node-gpu-detail.json", "power-swings.json",
                  "hardware-health.json", "fabric.json"]
DS_REF = "${datasource}"
REQUIRED_VARS = ("datasource", "cluster", "hpc_job", "instance", "gpu")

# The recording rules the rules in alerts/ provide for cluster and job panels.
RECORDING_RULES = {
    f"{prefix}:{name}"
    for prefix in ("hpc_job", "cluster")
    for name in ("gpu_power_watts:sum", "power_swing_amplitude_watts:sum",
                 "power_swing_phase_coherence:ratio",
                 "power_swing_coherent_amplitude_watts:estimate",
                 "power_ramp_watts_per_second:sum")
} | {"cluster:gpus_up:sum", "cluster:gpus_expected:sum",
     "hpc_job:power_swing_step_period_seconds:max"} | {
    # compute or wait (alerts/profiling.yml)
    "instance_gpu:gpu_compute_active_ratio:max", "instance_gpu:gpu_wait_active_ratio:clamp",
    "hpc_job:gpu_compute_active_ratio:avg", "hpc_job:gpu_wait_active_ratio:avg",
    "hpc_job:gpu_energy_joules_per_compute_second:ratio",
    "cluster:gpu_compute_active_ratio:avg", "cluster:gpu_wait_active_ratio:avg"} | {
    # goodput (alerts/global-goodput.yml)
    "cluster:gpu_goodput:ratio", "cluster:gpu_energy_per_productive_gpu_hour:joules",
    "cluster_state:gpu_badput:ratio", "namespace_pod:gpu_goodput:ratio",
    "hpc_job:gpu_goodput:ratio", "hpc_job_state:gpu_badput:ratio",
    "hpc_job:gpu_energy_per_productive_gpu_hour:joules"} | {
    f"{prefix}:{name}"
    for prefix, names in (
        ("namespace", ("gpu_power_watts:avg5m", "gpu_power:share", "gpu_utilization_ratio:sum",
                       "gpu_utilization:share")),
        ("namespace_pod", ("gpu_power_watts:avg5m", "gpus_held:sum")),
        ("hpc_job", ("gpu_power_watts:avg5m", "gpu_power:share", "gpu_utilization:share")))
    for name in names
}
BUILTINS = {"up", "ALERTS"}

# Grafana's built-in variables, as the test substitutes them.
GRAFANA_BUILTINS = {"__rate_interval": "10s", "__interval": "5s", "__range": "1m",
                    "__range_s": "60"}

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                "and", "or", "unless", "offset", "inf", "nan", "atan2"}


def load_boards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


BOARDS = load_boards()


def all_panels(board: dict) -> list[dict]:
    out = []
    for p in board.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))  # collapsed rows hold their panels
    return out


def query_panels(board: dict) -> list[dict]:
    return [p for p in all_panels(board) if p["type"] != "row"]


def documented_metrics() -> set[str]:
    text = (REPO / "docs" / "metrics.md").read_text()
    return set(re.findall(r"^\|\s*`([a-zA-Z_:][a-zA-Z0-9_:]*)`\s*\|", text, re.M))


def variables_of(board: dict) -> dict[str, dict]:
    return {v["name"]: v for v in board["templating"]["list"]}


def var_query(var: dict) -> str:
    """A query variable's query: Grafana saves it as a string or as {"query": ...}."""
    query = var["query"]
    return query["query"] if isinstance(query, dict) else query


def overlapping(panels: list[dict]) -> list[tuple[str, str]]:
    """Pairs of panels whose grid rectangles overlap (the SDK lays them out)."""
    def cells(p: dict) -> set[tuple[int, int]]:
        g = p["gridPos"]
        return {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}

    seen: dict[tuple[int, int], str] = {}
    pairs = []
    for p in panels:
        for cell in cells(p):
            if cell in seen:
                pairs.append((seen[cell], p["title"]))
            seen[cell] = p["title"]
    return sorted(set(pairs))


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace $var, ${var} and ${var:format} with values (Grafana's built-ins included)."""
    merged = {**GRAFANA_BUILTINS, **values}

    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in merged:
            raise AssertionError(f"unknown template variable ${name} in {expr!r}")
        return merged[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", repl, expr)


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (strings, matchers, ranges and label lists out)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\boffset\s+\w+", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", s):
        if m.group(2) or m.group(1) in PROMQL_WORDS:
            continue  # a function call or a keyword
        names.add(m.group(1))
    return names


def static_values(board: dict) -> dict[str, str]:
    """Variable values for syntax checks: `.*` for every query variable."""
    return {name: ".*" for name in variables_of(board)} | {"datasource": "prometheus"}


def label_values_as_query(query: str) -> tuple[str, str]:
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
    assert m, f"not a label_values(metric{{...}}, label) query: {query!r}"
    return f"count by ({m.group(2)}) ({m.group(1)})", m.group(2)


# --- shape ----------------------------------------------------------------------------

def test_the_five_dashboards_are_there():
    assert sorted(BOARDS) == sorted(EXPECTED_FILES)


def test_uids_and_titles_are_set_and_unique():
    uids = [b.get("uid") for b in BOARDS.values()]
    titles = [b.get("title") for b in BOARDS.values()]
    assert all(uids) and all(titles)
    assert len(set(uids)) == len(uids) and len(set(titles)) == len(titles)


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_dashboard_shape(name):
    board = BOARDS[name]
    assert board["schemaVersion"] >= 39
    assert "__inputs" not in board  # imported with a variable, not an export's input
    variables = variables_of(board)
    for required in REQUIRED_VARS:
        assert required in variables, f"{name}: no ${required} variable"
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    for var_name in REQUIRED_VARS[1:]:
        var = variables[var_name]
        assert var["type"] == "query", var_name
        assert var["datasource"] == {"type": "prometheus", "uid": DS_REF}
        query = var_query(var)
        assert query.startswith("label_values("), (var_name, query)
        label_values_as_query(query)
    panels = all_panels(board)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
    assert not overlapping(board["panels"]), f"{name}: panels overlap"
    for p in panels:
        where = f"{name} panel {p.get('id')} {p.get('title')!r}"
        assert p["type"] != "graph", f"{where}: deprecated graph panel"
        assert p.get("title"), where
        grid = p["gridPos"]
        assert {"x", "y", "w", "h"} <= grid.keys() and 0 <= grid["x"] < 24, where
        assert grid["x"] + grid["w"] <= 24, where
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": DS_REF}, where
        assert p["targets"], where
        refs = [t["refId"] for t in p["targets"]]
        assert all(refs) and len(set(refs)) == len(refs), where
        for t in p["targets"]:
            assert t.get("expr", "").strip(), where
            assert t.get("datasource", {"uid": DS_REF})["uid"] == DS_REF, where


def _walk(node, path=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield path, key, value
            yield from _walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}/{i}")


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_no_hard_coded_datasource(name):
    for path, key, value in _walk(BOARDS[name]):
        if key == "datasource":
            ref = value["uid"] if isinstance(value, dict) else value
            assert ref == DS_REF, f"{name}{path}: datasource {value!r}"
        if key == "uid" and path:
            assert path.endswith("/datasource") and value == DS_REF, f"{name}{path}: uid {value!r}"


def test_metric_names_are_documented_rules_or_builtins():
    known = documented_metrics() | RECORDING_RULES | BUILTINS
    assert len(documented_metrics()) > 150  # the tables were parsed
    unknown = []
    for name, board in BOARDS.items():
        exprs = [t["expr"] for p in query_panels(board) for t in p["targets"]]
        exprs += [label_values_as_query(var_query(v))[0]
                  for v in board["templating"]["list"] if v["type"] == "query"]
        for expr in exprs:
            for metric in metric_names(substitute(expr, static_values(board))):
                if metric not in known:
                    unknown.append(f"{name}: {metric} in {expr!r}")
    assert not unknown, "\n".join(unknown)


def test_metric_name_extraction():
    expr = ('sum by (hpc_job) (increase(gpu_energy_joules_total{cluster=~".*"}[1m]) * '
            'on(instance, gpu) group_left(hpc_job) gpu_hpc_job_info) or on() '
            'label_replace(vector(0), "severity", "none", "", "") offset 5m')
    assert metric_names(expr) == {"gpu_energy_joules_total", "gpu_hpc_job_info"}
    assert metric_names("cluster:gpus_up:sum / 2 > bool 1") == {"cluster:gpus_up:sum"}


def test_promql_parses_with_promtool(tmp_path):
    promtool = require_binary("promtool")
    rules, where = [], []
    for name, board in BOARDS.items():
        values = static_values(board)
        for p in query_panels(board):
            for t in p["targets"]:
                rules.append(substitute(t["expr"], values))
                where.append(f"{name} panel {p['id']} {p['title']!r} {t['refId']}")
        for v in board["templating"]["list"]:
            if v["type"] == "query":
                rules.append(substitute(label_values_as_query(var_query(v))[0], values))
                where.append(f"{name} variable {v['name']}")
    groups = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"dashboard_check_{i}", "expr": expr} for i, expr in enumerate(rules)]}]}
    path = tmp_path / "exprs.yml"
    path.write_text(yaml.safe_dump(groups, width=10_000))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    if proc.returncode != 0:
        bad = {int(i) for i in re.findall(r"dashboard_check_(\d+)", proc.stderr + proc.stdout)}
        detail = "\n".join(f"{where[i]}: {rules[i]}" for i in sorted(bad))
        pytest.fail(f"promtool check rules failed:\n{proc.stdout}{proc.stderr}\n{detail}")
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout


def generator():
    spec = importlib.util.spec_from_file_location("build_dashboards",
                                                  REPO / "scripts" / "build_dashboards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dashboards_match_their_generator():
    module = generator()
    built = module.build()
    assert sorted(built) == sorted(EXPECTED_FILES)
    for name, board in built.items():
        assert (DASHBOARDS / name).read_text() == module.render(board), (
            f"dashboards/{name} differs from scripts/build_dashboards.py: run it")


def test_generator_refuses_a_panel_past_the_24_columns():
    generator()  # puts scripts/ on sys.path
    from grafana_dashboards.common import dashboard, row, stat, ts

    ok = dashboard("t", "t", "", [row("r"), ts("a", ("up", "")), ts("b", ("up", ""))], [])
    assert [p.grid_pos.x for p in ok.panels] == [0, 0, 12]
    with pytest.raises(ValueError, match="does not fit"):
        dashboard("t", "t", "", [stat("a", ("up", ""), w=16), ts("b", ("up", ""))], [])


def test_overlap_check():
    a = {"title": "a", "gridPos": {"x": 0, "y": 0, "w": 12, "h": 8}}
    b = {"title": "b", "gridPos": {"x": 12, "y": 0, "w": 12, "h": 8}}
    c = {"title": "c", "gridPos": {"x": 6, "y": 7, "w": 12, "h": 8}}
    assert overlapping([a, b]) == []
    assert overlapping([a, b, c]) == [("a", "c"), ("b", "c")]


# --- live: every panel's query returns data -------------------------------------------

def rule_files() -> list[Path]:
    """alerts/*.yml that hold rule groups (promtool unit-test files there are left out)."""
    paths = sorted((REPO / "alerts").glob("*.yml")) if (REPO / "alerts").is_dir() else []
    return [p for p in paths if "groups" in (yaml.safe_load(p.read_text()) or {})]


def defined_recording_rules() -> set[str]:
    names = set()
    for path in rule_files():
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"] or []:
            names.update(r["record"] for r in group.get("rules", []) if "record" in r)
    return names


NODES = {
    # name: (cluster, scenario, extra flags); sysfs/jobs/kubelet/procfs filled in by the
    # fixture. The training node also serves processes and the pods a fake kubelet names.
    "train": ("alpha", "training", ["--ib", "--jobs", "--pods", "--collector.processes",
                                    "--collector.processes.interval", "2"]),
    "straggler": ("alpha", "straggler", ["--straggler.persistence", "5",
                                         "--no-collector.infiniband"]),
    "lost": ("beta", "gpu-lost", ["--no-collector.infiniband"]),
    "nvlink": ("beta", "nvlink-errors", ["--ib-small"]),
    "volta": ("beta", "retired-pages", ["--no-collector.infiniband"]),  # page retirement
}


class Fleet:
    def __init__(self, prom: Prometheus, addresses: dict[str, str]):
        self.prom = prom
        self.addresses = addresses
        self.deadline = time.monotonic() + 60


_stop = stop_process


def _healthy(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    require_binary("prometheus")
    work = tmp_path_factory.mktemp("dashboards")
    sysfs, small, empty = work / "sys", work / "sys-small", work / "sys-empty"
    ndr_hca(sysfs)
    roce_hca(sysfs)
    down_hca(sysfs)
    ndr_hca(small)
    empty.mkdir()
    jobs = work / "jobs"
    jobs.mkdir()
    for gpu in range(8):  # GPU 3 is shared by both jobs
        (jobs / str(gpu)).write_text(
            "train-a\n" if gpu < 3 else "train-a\ntrain-b\n" if gpu == 3 else "train-b\n")
    procfs = work / "proc"
    for spec in load_scenario("training").process_specs():
        for slot in range(len(spec.gpus)):
            for run in range(3):
                entry = procfs / str(spec.pid_of(slot, run))
                entry.mkdir(parents=True)
                (entry / "comm").write_text(spec.name + "\n")
                (entry / "cgroup").write_text(f"0::/kubepods/cri-containerd-{spec.container}"
                                              ".scope\n")
    require_module("grpc")  # the fake kubelet is a gRPC server
    from tests.fake_kubelet import FakeKubelet, Holding

    kubelet_socket = str(work / "kubelet.sock")
    procs, logs, addresses = [], [], {}
    prom = kubelet = None
    try:
        for name, (_, scenario, extra) in NODES.items():
            flags = {"--ib": ["--path.sysfs", str(sysfs)],
                     "--ib-small": ["--path.sysfs", str(small)],
                     "--jobs": ["--hpc-job-mapping-dir", str(jobs)],
                     "--pods": ["--kubernetes.pod-resources-socket", kubelet_socket,
                                "--path.procfs", str(procfs)]}
            args = [a for flag in extra for a in flags.get(flag, [flag])]
            address = f"127.0.0.1:{free_port()}"
            log = (work / f"{name}.log").open("w")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "exporter", "run", "--fake", "--scenario", scenario,
                 "--web.listen-address", address, *args],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO))
            addresses[name] = address
        for address in addresses.values():
            wait_for(lambda a=address: _healthy(a), timeout=30, interval=0.2)
        # the kubelet comes up after the exporter: two pods, GPU 3 shared by both
        uuids = [gpu_uuid(1, gpu) for gpu in range(8)]
        kubelet = FakeKubelet(kubelet_socket, [
            Holding("team-a", "llama-0", "trainer", "nvidia.com/gpu", tuple(uuids[:4])),
            Holding("team-b", "bert-1", "worker", "nvidia.com/gpu.shared",
                    tuple(f"{u}::0" for u in uuids[3:]))]).start()
        by_cluster: dict[str, list[str]] = {}
        for name, (cluster, _, _) in NODES.items():
            by_cluster.setdefault(cluster, []).append(addresses[name])
        scrape = [{"job_name": "gpu-nodes", "static_configs": [
            {"targets": targets, "labels": {"cluster": cluster}}
            for cluster, targets in sorted(by_cluster.items())]}]
        prom = Prometheus(work, [], scrape_interval="1s", scrape_configs=scrape,
                          rule_files=[str(p) for p in rule_files()] or None)
        fleet = Fleet(prom, addresses)
        # Wait (bounded) until the slowest signals are in: the straggler finding (5 s
        # persistence after the first 10 s window), XID 74 at 20 s, lost GPU 5 at 10 s.
        for expr in ("gpu_straggler_signal", "namespace:gpu_power:share",
                     'count_over_time(gpu_xid_errors_total{xid="74"}[1m]) >= 3', "gpu_up == 0",
                     "count(count_over_time("
                     f"gpu_node_power_swing_amplitude_watts[1m]) >= 3) == {len(NODES)}"):
            wait_for(lambda e=expr: prom.query(e), timeout=max(1, fleet.deadline
                                                               - time.monotonic()),
                     interval=0.5)
        yield fleet
    finally:
        if kubelet is not None:
            kubelet.stop()
        if prom is not None:
            prom.stop()
        for proc in procs:
            _stop(proc)
        for log in logs:
            log.close()


def live_values(board: dict, fleet: Fleet) -> dict[str, str]:
    """All for every variable that has it; else a value that exists (the training node)."""
    values = {"datasource": "prometheus"}
    for name, var in variables_of(board).items():
        if name == "datasource":
            continue
        if var.get("includeAll"):
            values[name] = var.get("allValue") or ".*"
        elif name == "instance":
            values[name] = fleet.addresses["train"]
        else:
            raise AssertionError(f"no test value for variable ${name}")
    return values


def test_variable_queries_return_values(fleet):
    expected = {"cluster": {"alpha", "beta"}, "hpc_job": {"train-a", "train-b"},
                "instance": set(fleet.addresses.values()), "gpu": {str(i) for i in range(8)},
                "device": {"mlx5_0", "mlx5_4", "mlx5_7"}}
    for name, board in BOARDS.items():
        values = live_values(board, fleet) | {"instance": ".*"}
        for var in board["templating"]["list"]:
            if var["type"] != "query":
                continue
            query, label = label_values_as_query(var_query(var))
            result = fleet.prom.query(substitute(query, values))
            got = {r["metric"].get(label) for r in result}
            assert got == expected[var["name"]], (name, var["name"], got)


PANELS = [(name, p) for name, board in BOARDS.items() for p in query_panels(board)]


@pytest.mark.parametrize(("name", "panel"), PANELS,
                         ids=[f"{n}:{p['id']}:{p['title']}" for n, p in PANELS])
def test_panel_query_returns_data(fleet, name, panel):
    expr = panel["targets"][0]["expr"]
    needs = sorted(metric_names(substitute(expr, static_values(BOARDS[name])))
                   & RECORDING_RULES)
    missing = [rule for rule in needs if rule not in defined_recording_rules()]
    if missing:
        pytest.skip(f"{name} panel {panel['title']!r} needs recording rule(s) "
                    f"{', '.join(missing)}, which no alerts/*.yml defines yet")
    query = substitute(expr, live_values(BOARDS[name], fleet))
    # Most panels answer at once; a rate over a series that just appeared may need a
    # few more scrapes. Bounded by the fleet's deadline plus a short grace.
    deadline = max(fleet.deadline, time.monotonic() + 5)
    while True:
        result = fleet.prom.query(query)
        if result or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert result, f"{name} panel {panel['id']} {panel['title']!r}: no data for {query}"
