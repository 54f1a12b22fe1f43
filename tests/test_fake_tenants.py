"""The fake's processes (that come and go) and MIG instances, through pynvml's own calls."""

from __future__ import annotations

import pynvml
import pytest

from exporter.sim import fake
from exporter.sim.scenarios import load_scenario
from exporter.sim.tenants import NAMESPACE_OID, ProcessSpec, processes_at, uuid5_oid, uuid_text
from exporter.yamlfile import ConfigError
from tests.tools import ManualClock, scenario_from_yaml


@pytest.fixture
def node(request):
    clock = ManualClock()
    with fake.installed(load_scenario(request.param), clock, costs=None) as lib:
        pynvml.nvmlInit()
        try:
            yield lib, clock
        finally:
            pynvml.nvmlShutdown()


def pids(handle) -> list[int]:
    return [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)]


@pytest.mark.parametrize("node", ["training"], indirect=True)
def test_processes_come_and_go_each_run_a_new_pid(node):
    _, clock = node
    gpu0, gpu1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    clock.advance(5)
    assert pids(gpu0) == [4100] and pids(gpu1) == [4101]
    clock.advance(10)  # t = 15: the evaluation process runs (10-30 s)
    assert pids(gpu0) == [4100, 9000]
    clock.advance(20)  # t = 35: it exited
    assert pids(gpu0) == [4100]
    clock.advance(40)  # t = 75: its second run, with a new pid
    assert pids(gpu0) == [4100, 9001]


@pytest.mark.parametrize("node", ["training"], indirect=True)
def test_process_utilization_is_the_mean_since_last_seen(node):
    _, clock = node
    gpu0 = pynvml.nvmlDeviceGetHandleByIndex(0)
    clock.advance(20)
    since = int((clock() - 20) * 1e6)  # 0-20 s: the trainer all along, eval for 10 of 20 s
    samples = {s.pid: s for s in pynvml.nvmlDeviceGetProcessUtilization(gpu0, since)}
    assert samples[4100].smUtil == 65 and samples[9000].smUtil == 5
    assert {s.timeStamp for s in samples.values()} == {int(clock() * 1e6)}
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing new since now
        pynvml.nvmlDeviceGetProcessUtilization(gpu0, int(clock() * 1e6))


def test_idle_workload_has_no_processes(clock):
    with fake.installed(load_scenario("idle"), clock, costs=None):
        pynvml.nvmlInit()
        clock.advance(5)
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pids(handle) == []
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
        pynvml.nvmlShutdown()


@pytest.mark.parametrize("node", ["mig"], indirect=True)
def test_mig_devices_answer_their_own_identity_and_memory(node):
    _, clock = node
    clock.advance(10)
    gpu0 = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(gpu0) == [1, 1]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu0) == 7
    found = []
    for index in range(7):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, index)
        except pynvml.NVMLError_NotFound:
            continue
        attributes = pynvml.nvmlDeviceGetAttributes_v2(mig)
        memory = pynvml.nvmlDeviceGetMemoryInfo(mig)
        found.append((pynvml.nvmlDeviceGetGpuInstanceId(mig),
                      pynvml.nvmlDeviceGetComputeInstanceId(mig),
                      attributes.gpuInstanceSliceCount, attributes.memorySizeMB,
                      memory.total, pids(mig)))
        assert pynvml.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert [f[:4] for f in found] == [(1, 0, 3, 72192), (5, 0, 2, 35456), (13, 0, 1, 18176),
                                      (14, 0, 1, 18176)]
    assert [f[5] for f in found] == [[5101], [5105], [6100], []]  # the notebook runs at 10 s
    assert found[0][4] == 72192 * 2**20
    # whole-GPU processes carry their instance ids
    assert {p.pid: p.gpuInstanceId for p in
            pynvml.nvmlDeviceGetComputeRunningProcesses_v3(gpu0)} == {5101: 1, 5105: 5,
                                                                      6100: 13}
    # what NVML does not give in MIG mode
    for call in (lambda: pynvml.nvmlDeviceGetUtilizationRates(gpu0),
                 lambda: pynvml.nvmlDeviceGetProcessUtilization(gpu0, 0)):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()


@pytest.mark.parametrize("node", ["mig"], indirect=True)
def test_whole_gpus_are_not_in_mig_mode(node):
    gpu2 = pynvml.nvmlDeviceGetHandleByIndex(2)
    assert pynvml.nvmlDeviceGetMigMode(gpu2) == [0, 0]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu2, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(gpu2)


def test_repeating_processes_in_a_long_span_are_bounded():
    spec = ProcessSpec((0,), 100, start=0, duration=1, every=2)
    got = processes_at((spec,), 1e6, 1e6 + 10)
    assert [p.pid for p in got] == [100 + k for k in range(500_000, 500_006)]


@pytest.mark.parametrize(("text", "message"), [
    ("processes: [{gpu: 9, pid: 1}]", "GPU index"),
    ("processes: [{gpu: 0}]", "pid: required"),
    ("processes: [{gpu: 0, pid: 1}, {gpu: 1, pid: 1}]", "used twice"),
    ("processes: [{gpu: 0, pid: 1, every: 10}]", "duration"),
    ("processes: [{gpu: 0, pid: 1, name: 'a very long command name'}]", "comm"),
    ("processes: [{gpu: 0, pid: 1, container: 'abc'}]", "64 lowercase hex"),
    ("processes: [{gpu: 0, pid: 1, gpu_instance: 1}]", "not split"),
    ("processes: {gpu: 0}", "expected a list"),
    ("mig: [{gpu: 0, instances: [{gpu_instance: 1, slices: 1, memory_mib: 1}]}]\n"
     "processes: [{gpu: 0, pid: 1}]", "split into MIG"),
    ("mig: [{gpu: 0, instances: []}]", "1-7 instances"),
    ("mig: [{gpu: 0, instances: [{gpu_instance: 1, slices: 1, memory_mib: 1},"
     " {gpu_instance: 1, slices: 1, memory_mib: 1}]}]", "distinct"),
    ("mig: [{gpu: 0, instances: [{gpu_instance: 1, slices: 9, memory_mib: 1}]}]",
     "out of range"),
    ("mig: [{gpu: [0, 0], instances: []}]", "distinct GPU"),
])
def test_bad_tenants_are_refused_with_one_line(text, message):
    with pytest.raises(ConfigError, match=message) as info:
        scenario_from_yaml("gpus: 2\n" + text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["cte-0-3", "cte-fabric-7", "cte-PF0A1B2C-mig-1-0", "",
                                  "naïve-ü"])
def test_the_fakes_uuids_are_uuid5_in_the_oid_namespace(name):
    import uuid

    expected = uuid.uuid5(uuid.NAMESPACE_OID, name)
    assert uuid.NAMESPACE_OID.bytes == NAMESPACE_OID
    assert uuid5_oid(name) == expected.bytes
    assert uuid_text(uuid5_oid(name)) == str(expected)
