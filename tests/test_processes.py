"""Per-process memory, SM utilization and energy: the split, its bounds, /proc labels, and
the collector on the fake (processes that come and go, MIG, a lost GPU)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from exporter.collectors.processes.families import processes_families
from exporter.collectors.processes.procfs import ProcReader, container_id, parse_comm
from exporter.collectors.processes.reading import ProcessesCollector, split_energy
from exporter.collectors.processes.spec import DEFAULT_MAX
from exporter.sampling.collector_api import CollectorContext
from exporter.sim.scenarios import load_scenario
from tests.tools import http_get, make_snapshot, samples

CID = "3f1e9c0b7d2a4e6f8a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6071"

# ---------------------------------------------------------------- the split


def test_energy_splits_by_sm_share_and_the_rest_is_idle():
    per_pid, idle = split_energy(100.0, {1: 0.5, 2: 0.2})
    assert per_pid == {1: 50.0, 2: 20.0} and idle == pytest.approx(30.0)


def test_shares_past_one_are_scaled_and_bad_shares_count_zero():
    per_pid, idle = split_energy(90.0, {1: 1.0, 2: 0.8, 3: -0.5, 4: float("nan")})
    assert per_pid[1] == pytest.approx(50.0) and per_pid[2] == pytest.approx(40.0)
    assert per_pid[3] == 0.0 and per_pid[4] == 0.0 and idle == pytest.approx(0.0)


# ---------------------------------------------------------------- a scripted GPU


class ScriptedBackend:
    """One GPU whose process list, utilization samples and energy the test sets."""

    def __init__(self) -> None:
        self.listed: list | None = []
        self.samples: list | None = []
        self.asked_since: list[int] = []

    def handle(self, gpu):
        return object()

    def call(self, name, *args, gpu=None, expected=()):
        assert name == "nvmlDeviceGetComputeRunningProcesses_v3"
        return self.listed

    def process_utilization(self, gpu, last_seen_us, handle=None):
        self.asked_since.append(last_seen_us)
        return self.samples


def proc(pid: int, memory: int = 2**30, gi: int = 0xFFFFFFFF):
    return SimpleNamespace(pid=pid, usedGpuMemory=memory, gpuInstanceId=gi,
                           computeInstanceId=gi)


def sample(pid: int, sm: int, stamp: int):
    return SimpleNamespace(pid=pid, smUtil=sm, timeStamp=stamp)


@pytest.fixture
def scripted():
    backend = ScriptedBackend()
    state = {"energy": 1000.0, "now": 50.0, "readable": True}
    context = CollectorContext(gpu_count=1, backend=backend,
                               readable=lambda gpu: state["readable"],
                               energy_joules=lambda gpu: state["energy"],
                               clock=lambda: state["now"])
    return backend, state, context


def by_pid(reading) -> dict[int, object]:
    return {p.pid: p for p in reading.processes}


def test_energy_is_conserved_and_exited_processes_go(scripted):
    backend, state, context = scripted
    source = ProcessesCollector(context, DEFAULT_MAX)
    backend.listed = [proc(10), proc(11)]
    first = source.read()  # the baseline: nothing attributed yet
    assert {p.energy_joules for p in first.processes} == {0.0}
    assert backend.asked_since == [50_000_000]  # from the first read on, not the past
    state["energy"] = 1100.0
    backend.samples = [sample(10, 60, 60_000_000), sample(11, 30, 59_000_000),
                       sample(0, 99, 61_000_000)]  # pid 0: the driver's empty entries
    second = by_pid(source.read())
    assert second[10].energy_joules == pytest.approx(60.0)
    assert second[11].energy_joules == pytest.approx(30.0)
    assert second[10].sm_utilization_ratio == pytest.approx(0.6)
    state["energy"] = 1200.0
    backend.listed = [proc(10)]  # 11 exited: it still ran in this span
    backend.samples = [sample(10, 50, 70_000_000), sample(11, 20, 65_000_000)]
    third = source.read()
    assert backend.asked_since[-1] == 60_000_000  # the newest real sample seen
    assert by_pid(third)[11].memory_used_bytes is None
    assert by_pid(third)[11].energy_joules == pytest.approx(50.0)
    total = sum(p.energy_joules for p in third.processes) + third.idle_energy_joules[0]
    assert total == pytest.approx(200.0)
    state["energy"] = 1250.0
    backend.samples = []  # nothing ran: all idle
    fourth = source.read()
    assert set(by_pid(fourth)) == {10}  # 11's series are gone
    assert by_pid(fourth)[10].sm_utilization_ratio == 0.0
    assert fourth.idle_energy_joules[0] == pytest.approx(10 + 30 + 50)


def test_an_energy_reset_is_a_new_baseline(scripted):
    backend, state, context = scripted
    source = ProcessesCollector(context, DEFAULT_MAX)
    backend.listed = [proc(10)]
    source.read()
    state["energy"] = 10.0  # the GPU came back: its sampled energy restarted
    backend.samples = [sample(10, 100, 60_000_000)]
    assert by_pid(source.read())[10].energy_joules == 0.0
    state["energy"] = 20.0
    assert by_pid(source.read())[10].energy_joules == pytest.approx(10.0)


def test_without_process_utilization_there_is_no_energy_split(scripted):
    backend, state, context = scripted
    backend.listed, backend.samples = [proc(10, gi=3)], None  # MIG mode: NotSupported
    source = ProcessesCollector(context, DEFAULT_MAX)
    source.read()
    state["energy"] = 2000.0
    reading = source.read()
    (process,) = reading.processes
    assert process.energy_joules is None and process.sm_utilization_ratio is None
    assert process.gpu_instance == 3 and reading.idle_energy_joules == {}


def test_the_cap_keeps_known_processes_then_the_biggest(scripted):
    backend, state, context = scripted
    source = ProcessesCollector(context, 2)
    backend.listed = [proc(10, 1), proc(11, 5), proc(12, 3)]
    assert set(by_pid(source.read())) == {11, 12}  # by memory
    backend.listed = [proc(10, 1), proc(11, 5), proc(12, 3), proc(13, 9)]
    reading = source.read()
    assert set(by_pid(reading)) == {11, 12}  # already exported ones keep their place
    assert reading.dropped_total == 1 + 2
    state["energy"] = 1100.0
    backend.samples = [sample(13, 40, 60_000_000), sample(11, 10, 60_000_000)]
    reading = source.read()
    assert reading.idle_energy_joules[0] == pytest.approx(90.0)  # 13's share stays idle


def test_an_unreadable_gpu_is_left_out_and_resumes(scripted):
    backend, state, context = scripted
    source = ProcessesCollector(context, DEFAULT_MAX)
    backend.listed = [proc(10)]
    source.read()
    state["readable"] = False
    assert source.read().processes == ()
    state["readable"], state["energy"] = True, 1100.0
    backend.samples = [sample(10, 100, 60_000_000)]
    assert by_pid(source.read())[10].energy_joules == pytest.approx(100.0)
    backend.listed = None  # the list call failed (counted by the backend)
    assert source.read().processes == ()


# ---------------------------------------------------------------- /proc labels


@pytest.mark.parametrize(("raw", "expected"), [
    (b"0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + CID.encode() + b".scope\n",
     CID),
    (b"12:memory:/docker/" + CID.encode() + b"\n11:cpu:/docker/" + CID.encode() + b"\n", CID),
    (b"0::/system.slice/crio-" + CID.encode() + b".scope\n", CID),
    (b"0::/user.slice/user-1000.slice/session-2.scope\n", ""),
    (b"0::/" + b"a" * 65 + b"\n", ""),  # 65 hex digits: not an id
    (b"\xff\xfe garbage \x00", ""),
    (b"", ""),
])
def test_container_ids_from_cgroup_files(raw, expected):
    assert container_id(raw) == expected


def test_command_names_are_bounded_and_printable():
    assert parse_comm(b"python\n") == "python"
    assert parse_comm(b"a\x1bb\xffcdefghijklmnopqrstuvwxyz\n") == "a?b\ufffdcdefghijklm"


def write_proc(root, pid: int, comm: str, cgroup: str, environ: bytes = b"") -> None:
    entry = root / str(pid)
    entry.mkdir(parents=True)
    (entry / "comm").write_text(comm + "\n")
    (entry / "cgroup").write_text(cgroup)
    (entry / "environ").write_bytes(environ)


def test_proc_entries_that_vanish_or_deny_are_counted(tmp_path):
    write_proc(tmp_path, 7, "python", f"0::/docker/{CID}\n")
    (tmp_path / "8").write_text("not a directory")
    (tmp_path / "9").mkdir()
    os.symlink("/etc/hostname", tmp_path / "9" / "comm")  # never followed
    reader = ProcReader(str(tmp_path))
    assert reader.labels(7).command == "python" and reader.labels(7).container_id == CID
    assert reader.labels(6) is None and reader.labels(8) is None
    assert reader.labels(9) is None
    assert reader.errors == {"vanished": 2, "read_error": 1, "environ_denied": 0}


# ---------------------------------------------------------------- on the fake


def scrape(exp) -> dict:
    return samples(http_get(exp.port)[1])


def series(got: dict, name: str, gpu: str = "0") -> dict[str, float]:
    return {s.labels["pid"]: s.value for s in got.get(name, []) if s.labels["gpu"] == gpu}


def test_processes_on_the_training_fake(running_exporter, tmp_path):
    scenario = load_scenario("training")
    for spec in scenario.process_specs():  # a /proc tree for the fake's PIDs
        for slot in range(len(spec.gpus)):
            for run in range(2):
                ranks = (f"RANK={8 + slot}\0LOCAL_RANK={slot}\0".encode()
                         if spec.name == "python" else b"")  # evaluation: no rank
                write_proc(tmp_path, spec.pid_of(slot, run), spec.name,
                           f"0::/kubepods/cri-containerd-{spec.container}.scope\n",
                           b"PATH=/usr/bin\0" + ranks)
    exp = running_exporter.start(manual=True, collector_processes=True,
                                 path_procfs=str(tmp_path))
    exp.sampler.advance(16)  # reads at 0 and 15 s: the evaluation process runs 10-30 s
    got = scrape(exp)
    for name in ("gpu_process_memory_used_bytes", "gpu_process_sm_utilization_ratio",
                 "gpu_process_energy_joules_total"):
        assert {"gpu", "uuid", "pid"} == set(got[name][0].labels), name
    assert set(series(got, "gpu_process_memory_used_bytes")) == {"4100", "9000"}
    assert set(series(got, "gpu_process_energy_joules_total")) == {"4100", "9000", "idle"}
    assert series(got, "gpu_process_sm_utilization_ratio")["4100"] == pytest.approx(0.65)
    info = {s.labels["pid"]: s.labels for s in got["gpu_process_info"]
            if s.labels["gpu"] == "0"}
    assert info["4100"]["command"] == "python" and info["9000"]["command"] == "eval"
    assert info["9000"]["container_id"] == scenario.process_specs()[1].container
    assert (info["4100"]["rank"], info["4100"]["local_rank"]) == ("8", "0")
    assert (info["9000"]["rank"], info["9000"]["local_rank"]) == ("", "")
    reading = exp.current.snapshot.collectors["processes"].reading
    assert reading.gpu_ranks() == {gpu: 8 + gpu for gpu in range(8)}  # eval has no rank
    before = series(got, "gpu_process_energy_joules_total")
    exp.sampler.advance(30)  # t = 46: the evaluation process exited at 30 s
    got = scrape(exp)
    after = series(got, "gpu_process_energy_joules_total")
    assert after["4100"] > before["4100"] and after["idle"] > before["idle"]
    assert "9000" not in after and "9000" not in series(got, "gpu_process_memory_used_bytes")
    assert "9000" not in {s.labels["pid"] for s in got["gpu_process_info"]}
    gpu1 = series(got, "gpu_process_energy_joules_total", "1")
    sampled = next(s.value for s in got["gpu_power_sampled_energy_joules_total"]
                   if s.labels["gpu"] == "1")
    # the split adds up to the GPU's sampled energy between the first and last reads
    assert 0.9 * sampled < sum(gpu1.values()) < sampled
    assert gpu1["4101"] / sum(gpu1.values()) == pytest.approx(0.65, abs=0.01)


def test_a_fake_node_reads_no_proc_labels_from_this_host(running_exporter):
    exp = running_exporter.start(manual=True, collector_processes=True)
    exp.sampler.advance(1)
    got = scrape(exp)
    assert {(s.labels["command"], s.labels["container_id"], s.labels["rank"],
             s.labels["local_rank"]) for s in got["gpu_process_info"]} == {("", "", "", "")}


def test_processes_off_by_default(running_exporter):
    exp = running_exporter.start(manual=True)
    exp.sampler.advance(1)
    assert "gpu_process_memory_used_bytes" not in scrape(exp)


def test_mig_processes_have_memory_and_instance_but_no_split(running_exporter):
    exp = running_exporter.start(manual=True, scenario="mig", collector_processes=True)
    exp.sampler.advance(16)
    got = scrape(exp)
    assert series(got, "gpu_process_memory_used_bytes") == {
        "5101": 50 * 2**30, "5105": 30 * 2**30, "6100": 4 * 2**30}
    assert series(got, "gpu_process_energy_joules_total") == {}
    instances = {s.labels["pid"]: s.labels["gpu_instance"] for s in got["gpu_process_info"]}
    assert instances["5101"] == "1" and instances["4102"] == ""
    assert set(series(got, "gpu_process_energy_joules_total", "2")) == {"4102", "idle"}


def test_a_lost_gpu_loses_its_process_series(running_exporter):
    exp = running_exporter.start(manual=True, scenario="gpu-lost", collector_processes=True,
                                 processes_interval_seconds=5.0)
    exp.sampler.advance(6)
    assert "4105" in series(scrape(exp), "gpu_process_memory_used_bytes", "5")
    exp.sampler.advance(10)  # GPU 5 fell off the bus at 10 s
    got = scrape(exp)
    assert series(got, "gpu_process_memory_used_bytes", "5") == {}
    assert "4104" in series(got, "gpu_process_memory_used_bytes", "4")


def test_families_leave_out_gpus_without_identity():
    source_reading = SimpleNamespace(processes=(), idle_energy_joules={7: 1.0}, dropped_total=0,
                                     proc_errors_total={})
    names = [f.name for f in processes_families(source_reading, make_snapshot(2))]
    assert names == ["cte_gpu_processes_dropped", "cte_gpu_process_proc_errors"]
