"""Fleet scenarios (parsing, errors with file:line), node mapping, generated sysfs, a tiny fleet."""

from __future__ import annotations

import urllib.request

import pytest

from exporter.cli import main
from exporter.collectors.infiniband.reading import InfinibandCollector
from exporter.commands.simulate.fabric import NodeFabric
from exporter.commands.simulate.runner import Fleet, FleetSettings
from exporter.commands.simulate.scenario import (
    IbFault,
    InfinibandSpec,
    builtin_fleet_names,
    load_fleet_scenario,
    parse_fleet_scenario,
)
from exporter.yamlfile import ConfigError, load_yaml
from tests.tools import free_port, wait_for


def parse(text: str, **kw):
    return parse_fleet_scenario(load_yaml(text, "f.yaml"), "f.yaml", "f", **kw)


def test_builtins_load():
    assert {"healthy", "faults", "two-jobs", "sharded"} <= set(builtin_fleet_names())
    for name in builtin_fleet_names():
        scenario = load_fleet_scenario(name)
        assert scenario.nodes == (32 if name == "sharded" else 8) and scenario.jobs


def test_sharded_has_two_jobs_of_16_and_one_straggler():
    sc = load_fleet_scenario("sharded")
    assert [(j.name, j.nodes) for j in sc.jobs] == [("5001", tuple(range(16))),
                                                    ("5002", tuple(range(16, 32)))]
    assert [(node, gpu, o.clock_scale) for node, gpu, o in sc.stragglers] == [(5, 3, 0.75)]


def test_faults_map_to_nodes_and_gpus():
    sc = load_fleet_scenario("faults")
    node7 = sc.node_scenario(7)
    assert {(e.kind, e.gpu) for e in node7.events} == {("xid", 2), ("error", 2)}
    assert sc.node_scenario(0).events == ()
    assert sc.node_scenario(3).overrides[5].clock_scale == 0.75
    # the whole job waits for the straggler: every node steps at the same, longer period
    periods = set()
    for node in range(8):
        w = sc.node_scenario(node).workload
        if node != 3:
            periods.add(round(w.step_period_seconds, 6))
    assert len(periods) == 1 and periods.pop() > 2.0
    assert [f.node for f in sc.ib_faults] == [2, 4]
    # UUIDs differ between nodes (seed per node)
    assert sc.node_scenario(0).seed != sc.node_scenario(1).seed


def test_two_jobs_and_idle_nodes():
    sc = parse("nodes: 4\njobs:\n  - {name: a, nodes: 0-1, step_period_seconds: 3}\n")
    assert sc.node_scenario(0).workload.step_period_seconds == 3
    assert sc.node_scenario(3).workload.type == "idle"
    assert sc.job_of(2) is None


def test_node_and_gpu_flags_override():
    sc = load_fleet_scenario("healthy", nodes=3, gpus_per_node=2)
    assert sc.nodes == 3 and sc.gpus_per_node == 2 and sc.jobs[0].nodes == (0, 1, 2)


@pytest.mark.parametrize("text, message", [
    ("nodes: 4\nbogus: 1\n", "f.yaml:2: bogus: unknown key"),
    ("nodes: 4\njobs:\n  - {name: a, nodes: [0, 9]}\n",
     "f.yaml:3: jobs.nodes: node 9 is out of range"),
    ("nodes: 4\njobs:\n  - {name: a, nodes: all}\n  - {name: b, nodes: [1]}\n",
     "f.yaml:4: jobs.nodes: node 1 already runs job a"),
    ("nodes: 4\nfaults:\n  - {kind: xid, node: 1, at: 5}\n", "f.yaml:3: faults.code: required"),
    ("nodes: 4\nfaults:\n  - kind: laser\n    node: 1\n", "f.yaml:3: faults.kind: expected one of"),
    ("nodes: 4\nfaults:\n  - {kind: xid, at: 5, code: 79}\n", "faults.node: required"),
    ("nodes: 4\nfaults:\n  - {kind: ib_down, node: 1, hca: 5}\n", "faults.hca: 5 is out of range"),
    ("nodes: 4\nfaults:\n  - {kind: straggler, node: 1}\n", "faults.gpu: required"),
    ("nodes: 4\nfaults:\n  - {kind: ib_errors, node: 1, typo_per_second: 3}\n",
     "faults.typo_per_second: unknown key"),
])
def test_errors_name_file_line_and_key(text, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("[", r"\[")):
        parse(text)


def test_generated_sysfs_reads_clean_and_advances(tmp_path):
    faults = [IbFault("ib_down", 0, 0, 10.0, 20.0),
              IbFault("ib_errors", 0, 1, 0.0, None, {"symbol_error_per_second": 5.0})]
    fabric = NodeFabric(tmp_path, 0, InfinibandSpec(hcas=2), faults, training=True)
    source = InfinibandCollector(tmp_path)

    def ports():
        reading = source.read()
        assert not any(reading.skipped_total.values()), reading.skipped_total
        return {p.device: p for d in reading.devices for p in d.ports}

    assert ports()["mlx5_0"].state_id == 4
    fabric.update(12.0)
    second = ports()
    assert second["mlx5_0"].state_id == 1 and second["mlx5_1"].state_id == 4
    assert second["mlx5_0"].counters["link_downed"] == 2
    assert second["mlx5_1"].counters["symbol_error"] == 60
    fabric.update(30.0)
    third = ports()
    assert third["mlx5_0"].state_id == 4  # back up after `until`
    assert third["mlx5_1"].counters["port_xmit_data"] > second["mlx5_1"].counters["port_xmit_data"]


def test_tiny_fleet_serves_every_node():
    sc = load_fleet_scenario("two-jobs", nodes=2, gpus_per_node=2)
    options = {"power_drain_interval_seconds": 1, "profiling_interval_seconds": 1}
    for _ in range(10):  # a free port whose next one is free too (others take ports too)
        base = free_port()
        fleet = Fleet(sc, FleetSettings(base_port=base, options=options))
        try:
            fleet.start()
            break
        except OSError:
            continue  # start() has stopped what it started
    else:
        pytest.fail("no two free ports in a row in 10 tries")
    try:
        assert fleet.ports == [base, base + 1]
        for port in fleet.ports:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
            assert b"gpu_hpc_job_info" in body and b"infiniband_port_state_id" in body

        def profiled(port: int) -> bool:  # GPM through each node's private pynvml copy
            url = f"http://127.0.0.1:{port}/metrics"
            return b"gpu_tensor_active_ratio{" in urllib.request.urlopen(url, timeout=10).read()

        for port in fleet.ports:
            wait_for(lambda port=port: profiled(port), timeout=15)
    finally:
        fleet.stop()


def test_simulate_rejects_bad_flags(capsys):
    assert main(["simulate", "--nodes", "0"]) == 2
    assert "--nodes" in capsys.readouterr().err
    assert main(["simulate", "--scenario", "nope"]) == 2
    assert "unknown fleet scenario" in capsys.readouterr().err
