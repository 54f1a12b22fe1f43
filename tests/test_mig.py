"""MIG: instance identity and memory from the fake's `mig` scenario, profile names as the
device plugin writes them, and job mapping files named GPU.INSTANCE."""

from __future__ import annotations

import pytest

from exporter.collectors.mig.reading import profile_name
from tests.tools import http_get, samples, scenario_from_yaml


@pytest.mark.parametrize(("gi", "ci", "mib", "name"), [
    (1, 1, 9856, "1g.10gb"), (3, 3, 72192, "3g.71gb"), (7, 7, 144384, "7g.141gb"),
    (3, 1, 72192, "1c.3g.71gb"), (2, 0, 35456, "2g.35gb"),
])
def test_profile_names_follow_the_device_plugin(gi, ci, mib, name):
    assert profile_name(gi, ci, mib) == name


def scrape(exp) -> dict:
    return samples(http_get(exp.port)[1])


def test_mig_scenario_serves_instances_and_their_memory(running_exporter, tmp_path):
    (tmp_path / "0.1").write_text("llm-finetune\n")  # dcgm-exporter's name for GPU 0, GI 1
    (tmp_path / "2").write_text("train-42\n")
    exp = running_exporter.start(manual=True, scenario="mig",
                                 hpc_job_mapping_dir=str(tmp_path))
    exp.sampler.advance(6)
    got = scrape(exp)
    uuid0 = next(s.labels["uuid"] for s in got["gpu_info"] if s.labels["gpu"] == "0")
    info = {(s.labels["gpu"], s.labels["gpu_instance"]): s.labels
            for s in got["gpu_mig_instance_info"]}
    assert sorted(info) == [("0", "1"), ("0", "13"), ("0", "14"), ("0", "5"), ("1", "1"),
                            ("1", "2")]
    first = info[("0", "1")]
    assert first["uuid"] == uuid0 and first["mig_uuid"].startswith("MIG-")
    assert (first["profile"], first["compute_instance"]) == ("3g.71gb", "0")
    assert info[("0", "13")]["profile"] == "1g.18gb"
    assert len({labels["mig_uuid"] for labels in info.values()}) == 6
    total = {(s.labels["gpu"], s.labels["gpu_instance"]): s.value
             for s in got["gpu_mig_memory_total_bytes"]}
    used = {(s.labels["gpu"], s.labels["gpu_instance"]): s.value
            for s in got["gpu_mig_memory_used_bytes"]}
    assert total[("0", "1")] == 72192 * 2**20
    assert used[("0", "1")] == 50 * 2**30 + 512 * 2**20  # its process plus the context
    assert used[("0", "14")] == 512 * 2**20  # an empty instance
    enabled = {s.labels["gpu"]: s.value for s in got["gpu_mig_enabled"]}
    assert enabled == {"0": 1.0, "1": 1.0, **{str(g): 0.0 for g in range(2, 8)}}
    jobs = {(s.labels["gpu"], s.labels["gpu_instance"], s.labels["hpc_job"])
            for s in got["gpu_hpc_job_info"]}
    assert jobs == {("0", "1", "llm-finetune"), ("2", "", "train-42")}
    # NVML has no utilization for a GPU in MIG mode; the empty MIG slots are no errors
    assert {s.labels["gpu"] for s in got["gpu_utilization_ratio"]} == {str(g)
                                                                       for g in range(2, 8)}
    errors = {(s.labels["call"], s.labels["error"]) for s in got["cte_nvml_errors_total"]}
    assert ("nvmlDeviceGetMigDeviceHandleByIndex", "NotFound") not in errors


def test_a_node_without_mig_says_so_and_nothing_more(running_exporter):
    exp = running_exporter.start(manual=True)
    exp.sampler.advance(6)
    got = scrape(exp)
    assert {s.value for s in got["gpu_mig_enabled"]} == {0.0}
    assert "gpu_mig_instance_info" not in got and "gpu_mig_memory_used_bytes" not in got


def test_a_mig_device_that_cannot_name_itself_is_left_out(running_exporter, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("""
gpus: 2
mig:
  - gpu: 0
    instances:
      - {gpu_instance: 1, slices: 3, memory_mib: 40192}
      - {gpu_instance: 2, slices: 3, memory_mib: 40192}
events:
  - {kind: error, at: 0, call: nvmlDeviceGetGpuInstanceId, error: Unknown}
""")
    scenario_from_yaml(path.read_text())  # valid
    exp = running_exporter.start(manual=True, scenario=str(path))
    exp.sampler.advance(6)
    got = scrape(exp)
    assert "gpu_mig_instance_info" not in got
    assert {s.labels["gpu"]: s.value for s in got["gpu_mig_enabled"]} == {"0": 1.0, "1": 0.0}
    errors = {(s.labels["call"], s.labels["error"]): s.value
              for s in got["cte_nvml_errors_total"]}
    assert errors[("nvmlDeviceGetGpuInstanceId", "Unknown")] >= 2
    success = {s.labels["source"]: s.value for s in got["cte_source_success"]}
    assert success["mig"] == 1.0  # one device's error is not the collector's failure
