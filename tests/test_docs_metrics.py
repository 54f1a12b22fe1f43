"""docs/metrics.md and the real /metrics output list exactly the same families."""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.app import Exporter
from exporter.config import Config
from exporter.sim import ib_tree
from tests.tools import REPO, wait_for

CONDITIONAL = "(present only when"  # a row saying so need not show in a healthy run


def documented(required_only: bool = False) -> dict[str, tuple[str, set[str]]]:
    rows = {}
    for line in (REPO / "docs" / "metrics.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or not (m := re.fullmatch(r"`([a-z0-9_]+)`", cells[0])):
            continue
        assert m.group(1) not in rows, f"{m.group(1)} documented twice"
        labels = set() if cells[3] == "-" else set(re.findall(r"`([a-z_]+)`", cells[3]))
        if required_only and CONDITIONAL in cells[5]:
            continue
        rows[m.group(1)] = (cells[1], labels)
    return rows


def full_exposition(tmp_path_factory) -> str:
    """/metrics of a `full` fake run with every source that needs no daemon: InfiniBand
    and RoCE sysfs, a job mapping, a state directory (the history's families)."""
    sysfs = tmp_path_factory.mktemp("sysfs")
    state = tmp_path_factory.mktemp("state")  # the history's families too
    ib_tree.ndr_hca(sysfs)
    # a counter name no family knows yet: exported under the generic family
    ib_tree.write(sysfs / "class/infiniband/mlx5_0/ports/1/counters/future_counter", 7)
    ib_tree.roce_hca(sysfs)
    jobs = tmp_path_factory.mktemp("hpc-jobs")
    (jobs / "0").write_text("4242\n")
    exp = Exporter(Config.of(listen_address="127.0.0.1:0", fake=True, path_sysfs=str(sysfs),
                             metrics_profile="full",
                             hpc_job_mapping_dir=str(jobs), sources_interval_seconds=0.5,
                             storage_path=str(state)))
    exp.start()
    try:
        # CPU utilization needs two reads of the host source
        def body_with_cpu_utilization() -> str | None:
            body = exp.current.body.decode()
            ready = all(f"\n{name} " in body for name in (
                "host_cpu_utilization_ratio", "gpu_node_power_swing_active",
                "gpu_node_collective_stall_active"))
            return body if ready else None

        text = wait_for(body_with_cpu_utilization, timeout=20)
    finally:
        exp.stop()
    assert text is not None
    return text


@pytest.fixture(scope="module")
def exposed(tmp_path_factory) -> dict[str, tuple[str, set[str]]]:
    return _kinds(full_exposition(tmp_path_factory))


def test_every_exposed_family_is_documented(exposed):
    missing = sorted(set(exposed) - set(documented()))
    assert not missing, f"add to docs/metrics.md: {missing}"


def test_every_documented_family_is_exposed(exposed):
    stale = sorted(set(documented(required_only=True)) - set(exposed))
    assert not stale, f"documented but not exposed: {stale}"


def test_types_and_labels_match(exposed):
    docs = documented()
    for name, (kind, labels) in exposed.items():
        doc_kind, doc_labels = docs[name]
        assert doc_kind == kind, f"{name}: documented as {doc_kind}, exposed as {kind}"
        if labels:  # a family without samples here (e.g. no fan) shows no labels
            assert labels == doc_labels, f"{name}: labels {labels} vs documented {doc_labels}"


def _kinds(text: str) -> dict[str, tuple[str, set[str]]]:
    out = {}
    for family in text_string_to_metric_families(text):
        kind, name = family.type, family.name
        if kind == "counter":
            name += "_total"
        elif kind == "gauge" and name.endswith("_info"):
            kind = "info"
        out[name] = (kind, {label for s in family.samples for label in s.labels})
    return out


def test_who_uses_the_gpus_is_documented(running_exporter, tmp_path):
    """The collectors off by default or conditional (MIG, processes, Kubernetes), on a
    fake MIG node with a fake kubelet: documented with their types and labels."""
    from tests.tools import require_module

    require_module("grpc")
    from exporter.sim.physics import gpu_uuid
    from tests.fake_kubelet import FakeKubelet, Holding

    path = str(tmp_path / "k.sock")
    kubelet = FakeKubelet(path, [Holding("ns", "p", "c", "nvidia.com/gpu",
                                         (gpu_uuid(1, 2),))]).start()
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "0.1").write_text("7\n")
    try:
        exp = running_exporter.start(manual=True, scenario="mig", collector_processes=True,
                                     metrics_profile="full",
                                     kubernetes_pod_resources_socket=path,
                                     hpc_job_mapping_dir=str(tmp_path / "jobs"))
        exp.sampler.advance(16)
        exposed = _kinds(exp.current.body.decode())
    finally:
        kubelet.stop()
    docs = documented()
    for name in ("gpu_pod_info", "gpu_process_energy_joules_total", "gpu_mig_instance_info",
                 "cte_kubernetes_pod_resources_last_success_timestamp_seconds"):
        assert name in exposed, name
    for name, (kind, labels) in exposed.items():
        assert name in docs, f"add to docs/metrics.md: {name}"
        assert docs[name][0] == kind, name
        if labels:
            assert labels == docs[name][1], f"{name}: {labels} vs {docs[name][1]}"
