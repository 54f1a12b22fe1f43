"""deploy/slurm/prolog.sh and epilog.sh, run for real against a temporary directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from exporter.collectors.jobs.attributes import JobAttributesReader, parse_attributes
from exporter.collectors.jobs.reading import BadFile, JobAttributes, JobsCollector
from tests.tools import REPO, free_port, http_get, samples

SLURM = REPO / "deploy" / "slurm"
SHELLS = [s for s in ("sh", "bash") if shutil.which(s)]


@pytest.fixture(params=SHELLS)
def shell(request) -> str:
    return request.param


@pytest.fixture
def mapping(tmp_path) -> Path:
    return tmp_path / "hpc-jobs"


def run(shell: str, script: str, mapping: Path, bin_dir: Path | None = None,
        **env: str) -> subprocess.CompletedProcess:
    path = f"{bin_dir}:/usr/bin:/bin" if bin_dir else "/usr/bin:/bin"
    full_env = {"PATH": path, "CTE_HPC_JOB_MAPPING_DIR": str(mapping), **env}
    result = subprocess.run([shell, str(SLURM / script)], env=full_env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr  # a failing prolog drains the node
    return result


def prolog(shell, mapping, job, **env):
    return run(shell, "prolog.sh", mapping, SLURM_JOB_ID=job, **env)


def epilog(shell, mapping, job, **env):
    return run(shell, "epilog.sh", mapping, SLURM_JOB_ID=job, **env)


def contents(mapping: Path) -> dict[str, str]:
    """Visible files and their text (hidden files are the scripts' lock and temporaries)."""
    return {p.name: p.read_text() for p in sorted(mapping.iterdir())
            if not p.name.startswith(".")}


def test_several_gpus(shell, mapping):
    prolog(shell, mapping, "101", SLURM_JOB_GPUS="0,1,3")
    assert contents(mapping) == {"0": "101\n", "1": "101\n", "3": "101\n"}
    assert oct(os.stat(mapping / "0").st_mode & 0o777) == "0o644"
    epilog(shell, mapping, "101", SLURM_JOB_GPUS="0,1,3")
    assert contents(mapping) == {}


def test_cuda_visible_devices_when_slurm_job_gpus_is_unset(shell, mapping):
    prolog(shell, mapping, "7", CUDA_VISIBLE_DEVICES="2, 5")
    assert contents(mapping) == {"2": "7\n", "5": "7\n"}
    prolog(shell, mapping, "8", SLURM_JOB_GPUS="4", CUDA_VISIBLE_DEVICES="6")  # preferred
    assert contents(mapping) == {"2": "7\n", "4": "8\n", "5": "7\n"}


def test_shared_gpu_one_line_per_job_and_epilog_removes_only_its_own(shell, mapping):
    prolog(shell, mapping, "101", SLURM_JOB_GPUS="0,1")
    prolog(shell, mapping, "102", SLURM_JOB_GPUS="1,2")
    prolog(shell, mapping, "102", SLURM_JOB_GPUS="1,2")  # twice: still one line
    assert contents(mapping) == {"0": "101\n", "1": "101\n102\n", "2": "102\n"}
    epilog(shell, mapping, "101", SLURM_JOB_GPUS="0,1")
    assert contents(mapping) == {"1": "102\n", "2": "102\n"}
    epilog(shell, mapping, "1", SLURM_JOB_GPUS="1,2")  # a prefix of 102 is another job
    assert contents(mapping) == {"1": "102\n", "2": "102\n"}
    epilog(shell, mapping, "102", SLURM_JOB_GPUS="1,2")
    assert contents(mapping) == {}
    epilog(shell, mapping, "102", SLURM_JOB_GPUS="1,2")  # again: nothing to do, no error


def test_writes_are_atomic_renames_and_leave_no_temporaries(shell, mapping):
    prolog(shell, mapping, "101", SLURM_JOB_GPUS="0")
    inode = os.stat(mapping / "0").st_ino
    prolog(shell, mapping, "102", SLURM_JOB_GPUS="0")
    assert os.stat(mapping / "0").st_ino != inode  # replaced by rename, not rewritten
    assert [p.name for p in mapping.iterdir() if ".tmp." in p.name] == []


def test_concurrent_jobs_on_one_gpu_keep_every_line(shell, mapping):
    jobs = [str(1000 + i) for i in range(12)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(lambda j: prolog(shell, mapping, j, SLURM_JOB_GPUS="0,1"), jobs))
    for gpu in ("0", "1"):
        assert sorted((mapping / gpu).read_text().split()) == jobs
    with ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(lambda j: epilog(shell, mapping, j, SLURM_JOB_GPUS="0,1"), jobs))
    assert contents(mapping) == {}


@pytest.mark.parametrize("env", [{}, {"SLURM_JOB_GPUS": ""}, {"CUDA_VISIBLE_DEVICES": ""},
                                 {"CUDA_VISIBLE_DEVICES": " , "}])
def test_no_gpus_is_a_no_op(shell, mapping, env):
    prolog(shell, mapping, "101", **env)
    epilog(shell, mapping, "101", **env)
    assert not mapping.exists()


@pytest.mark.parametrize("job", ["", "1;touch x", "1 2", "../0"])
def test_missing_or_odd_job_id_is_a_no_op(shell, mapping, job):
    result = run(shell, "prolog.sh", mapping, SLURM_JOB_ID=job, SLURM_JOB_GPUS="0")
    assert not mapping.exists() and "SLURM_JOB_ID" in result.stderr


def test_uuids_and_garbage_are_skipped_and_the_rest_recorded(shell, mapping):
    result = prolog(shell, mapping, "101", CUDA_VISIBLE_DEVICES=(
        "GPU-8d1c5f4e-0000-1111-2222-333344445555,MIG-0a1b2c3d-4444-5555-6666-777788889999,"
        "NoDevFiles,01,-1,3,../../etc/passwd,*"))
    assert contents(mapping) == {"3": "101\n"}
    for entry in ("GPU-8d1c", "MIG-0a1b", "NoDevFiles", "'01'", "'-1'", "passwd", "'*'"):
        assert entry in result.stderr
    assert not (mapping.parent / "etc").exists()


def test_gpu_uuid_mapped_through_nvidia_smi_when_installed(shell, mapping, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, GPU-aaaa'\necho '1, GPU-bbbb'\n")
    smi.chmod(0o755)
    run(shell, "prolog.sh", mapping, bin_dir, SLURM_JOB_ID="5",
        CUDA_VISIBLE_DEVICES="GPU-bbbb,GPU-cccc")
    assert contents(mapping) == {"1": "5\n"}


def test_unusable_directory_is_reported_not_fatal(shell, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = prolog(shell, blocker / "hpc-jobs", "101", SLURM_JOB_GPUS="0")
    assert "cannot create" in result.stderr


def test_the_exporter_reads_what_the_scripts_write(shell, mapping):
    prolog(shell, mapping, "101", SLURM_JOB_GPUS="0,1")
    prolog(shell, mapping, "102_3", SLURM_JOB_GPUS="1")
    reading = JobsCollector(mapping, gpu_count=8).read()
    assert dict(reading.jobs) == {0: ("101",), 1: ("101", "102_3")}
    assert sum(reading.skipped_total.values()) == 0  # the lock file is not counted


def shared_part(text: str) -> str:
    start = text.index("# ---- shared part")
    return text[start:text.index("# ---- end of shared part")]


def test_prolog_and_epilog_share_the_same_common_part():
    assert shared_part((SLURM / "prolog.sh").read_text()) == shared_part(
        (SLURM / "epilog.sh").read_text())


def as_slurmd_runs(shell: str, script: str, settings: Path,
                   **env: str) -> subprocess.CompletedProcess:
    """As slurmd runs a prolog, epilog or HealthCheckProgram: with the variables it makes
    (the job's), no PATH and none of slurmd's own environment; the settings file's path
    is the one thing added (on a node it is the default)."""
    result = subprocess.run([shutil.which(shell) or shell, str(SLURM / script)],
                            env={"CTE_SLURM_ENV": str(settings), **env}, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_the_mapping_directory_comes_from_the_settings_file(shell, mapping, tmp_path):
    settings = tmp_path / "slurm.env"
    # only CTE_* names are read: a PATH here would leave the scripts without mkdir
    settings.write_text(f'# this node\nCTE_HPC_JOB_MAPPING_DIR="{mapping}"\nPATH=/nowhere\n'
                        "CTE_odd-name=1\n")
    as_slurmd_runs(shell, "prolog.sh", settings, SLURM_JOB_ID="101", SLURM_JOB_GPUS="0,1",
                   SLURM_JOB_USER="alice")
    assert contents(mapping) == {"0": "101\n", "1": "101\n"}
    assert (mapping / ".jobs" / "101").read_text() == "user=alice\n"
    # a variable that is set wins over the file
    other = tmp_path / "other"
    as_slurmd_runs(shell, "prolog.sh", settings, SLURM_JOB_ID="102", SLURM_JOB_GPUS="2",
                   CTE_HPC_JOB_MAPPING_DIR=str(other))
    assert contents(other) == {"2": "102\n"} and "2" not in contents(mapping)
    as_slurmd_runs(shell, "epilog.sh", settings, SLURM_JOB_ID="101", SLURM_JOB_GPUS="0,1")
    assert contents(mapping) == {} and not (mapping / ".jobs" / "101").exists()


def test_the_health_check_takes_its_command_config_and_flags_from_the_settings_file(
        shell, tmp_path):
    port = free_port()  # nothing listens there
    command = tmp_path / "cte"
    command.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m exporter "$@"\n')
    command.chmod(0o755)
    config = tmp_path / "config.yaml"
    config.write_text(f"listen_address: '127.0.0.1:{port}'\n")
    settings = tmp_path / "slurm.env"
    settings.write_text(f"CTE_BIN={command}\nCTE_CONFIG='{config}'\n"
                        "CTE_HEALTH_ARGS='--timeout 2'\n")
    result = as_slurmd_runs(shell, "health-check.sh", settings, SLURMD_NODENAME="n1")
    assert result.stdout.startswith(
        f"unknown: cannot reach the exporter at http://127.0.0.1:{port}/"), result.stdout
    assert "; slurm: nothing done" in result.stdout


SLURM_WHO = {"SLURM_JOB_USER": "alice", "SLURM_JOB_ACCOUNT": "physics",
             "SLURM_JOB_PARTITION": "gpu-h200"}


def test_prolog_records_user_account_and_partition_beside_the_job(shell, mapping):
    prolog(shell, mapping, "101", SLURM_JOB_GPUS="0,1", **SLURM_WHO)
    prolog(shell, mapping, "102", SLURM_JOB_GPUS="1")  # a job without them
    # the GPU files are dcgm-exporter's format, unchanged
    assert contents(mapping) == {"0": "101\n", "1": "101\n102\n"}
    assert (mapping / ".jobs" / "101").read_text() == (
        "user=alice\naccount=physics\npartition=gpu-h200\n")
    assert not (mapping / ".jobs" / "102").exists()
    assert [p.name for p in (mapping / ".jobs").iterdir() if ".tmp." in p.name] == []
    reading = JobsCollector(mapping, gpu_count=8,
                            attributes=JobAttributesReader(mapping)).read()
    assert dict(reading.jobs) == {0: ("101",), 1: ("101", "102")}
    assert dict(reading.attributes) == {"101": JobAttributes("alice", "physics", "gpu-h200")}
    assert sum(reading.skipped_total.values()) == 0
    epilog(shell, mapping, "101", SLURM_JOB_GPUS="0,1")
    assert not (mapping / ".jobs" / "101").exists()
    assert contents(mapping) == {"1": "102\n"}


def test_odd_attribute_values_are_left_out_and_the_rest_kept(shell, mapping):
    result = prolog(shell, mapping, "7", SLURM_JOB_GPUS="0", SLURM_JOB_USER="eve;rm -rf",
                    SLURM_JOB_ACCOUNT="a" * 129, SLURM_JOB_PARTITION="debug")
    assert (mapping / ".jobs" / "7").read_text() == "partition=debug\n"
    assert "SLURM_JOB_USER" in result.stderr and "SLURM_JOB_ACCOUNT" in result.stderr
    assert contents(mapping) == {"0": "7\n"}


@pytest.mark.parametrize(("raw", "expected"), [
    (b"user=bob\n", JobAttributes(user="bob")),
    (b"partition=p1\nfuture=x y\n\n", JobAttributes(partition="p1")),  # unknown keys
])
def test_attribute_files_parse(raw, expected):
    assert parse_attributes(raw) == expected


@pytest.mark.parametrize("raw", [b"user=a b\n", b"\xff", b"user\n", b"user=\x00",
                                 b"account=" + b"x" * 200])
def test_bad_attribute_files_are_refused(raw):
    with pytest.raises(BadFile):
        parse_attributes(raw)


def test_a_linked_or_bad_attribute_file_is_counted_and_the_job_still_served(tmp_path):
    (tmp_path / "0").write_text("5\n6\n7\n")
    jobs = tmp_path / ".jobs"
    jobs.mkdir()
    (jobs / "5").symlink_to("/etc/passwd")
    (jobs / "6").write_bytes(b"user=\xff\n")
    (jobs / "7").write_text("user=carol\n")
    collector = JobsCollector(tmp_path, 8, JobAttributesReader(tmp_path))
    for _ in range(2):  # the second pass from the cache counts the same
        reading = collector.read()
        assert reading.jobs[0] == ("5", "6", "7")
        assert dict(reading.attributes) == {"7": JobAttributes(user="carol")}
    assert reading.skipped_total["symlink"] == 2 and reading.skipped_total["garbage"] == 2


def test_gpu_hpc_job_info_carries_them_and_a_plain_file_is_as_before(running_exporter,
                                                                     mapping):
    prolog("sh", mapping, "101", SLURM_JOB_GPUS="0", **SLURM_WHO)
    (mapping / "1").write_text("202\n")  # written by something else, dcgm-style
    (mapping / "0.1").write_text("303\n")
    exp = running_exporter.start(manual=True, scenario="mig",
                                 hpc_job_mapping_dir=str(mapping))
    exp.sampler.advance(6)
    found = samples(http_get(exp.port)[1])["gpu_hpc_job_info"]
    # empty labels are no labels to Prometheus: a plain file's series is as it was
    got = {s.labels["hpc_job"]: {k: v for k, v in s.labels.items()
                                 if k.startswith("hpc_") and k != "hpc_job" and v}
           for s in found}
    assert got == {"101": {"hpc_user": "alice", "hpc_account": "physics",
                           "hpc_partition": "gpu-h200"},
                   "202": {}, "303": {}}


def test_the_three_scripts_read_their_settings_the_same_way():
    """Each script is installed on its own (prolog.d, epilog.d, the health check), so each
    carries the settings reader: the three copies must stay the same."""
    def reader(name: str) -> str:
        text = (REPO / "deploy" / "slurm" / name).read_text()
        start = text.index("cte_read_settings() {")
        return text[start:text.index("\n}\n", start)]
    copies = {name: reader(name) for name in ("prolog.sh", "epilog.sh", "health-check.sh")}
    assert len(set(copies.values())) == 1, copies
