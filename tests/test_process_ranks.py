"""A GPU process's ranks, from its environment: the launchers' names and their order,
garbage and the read's bound, an environment the kernel refuses, the cache, the family's
labels, and `ProcessesReading.gpu_ranks` (GPU -> global rank)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from exporter.collectors.processes.families import INFO, processes_families
from exporter.collectors.processes.procfs import (
    MAX_ENVIRON_BYTES,
    ProcLabels,
    ProcReader,
    parse_ranks,
)
from exporter.collectors.processes.reading import (
    GpuProcess,
    ProcessesCollector,
    ProcessesReading,
)
from exporter.sampling.collector_api import CollectorContext
from tests.test_processes import CID, ScriptedBackend, proc, write_proc
from tests.tools import REPO, make_snapshot


def env(*entries: str) -> bytes:
    """An environ as /proc gives it: each entry ended by a NUL."""
    return b"".join(entry.encode() + b"\0" for entry in entries)


# ---------------------------------------------------------------- names and their order


@pytest.mark.parametrize(("environ", "expected"), [
    (env("PATH=/usr/bin", "RANK=3", "LOCAL_RANK=1"), (3, 1)),
    (env("OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_LOCAL_RANK=2"), (5, 2)),
    (env("PMI_RANK=6"), (6, None)),
    (env("SLURM_PROCID=7", "SLURM_LOCALID=3"), (7, 3)),
    # RANK and LOCAL_RANK win wherever they stand (srun's ids are torchrun's, not its worker's)
    (env("SLURM_PROCID=1", "SLURM_LOCALID=0", "PMI_RANK=2", "OMPI_COMM_WORLD_RANK=9",
         "OMPI_COMM_WORLD_LOCAL_RANK=8", "RANK=12", "LOCAL_RANK=4"), (12, 4)),
    (env("SLURM_PROCID=1", "SLURM_LOCALID=0", "PMI_RANK=2", "OMPI_COMM_WORLD_RANK=9",
         "OMPI_COMM_WORLD_LOCAL_RANK=8"), (9, 8)),
    (env("SLURM_PROCID=1", "SLURM_LOCALID=0", "PMI_RANK=2"), (2, 0)),
    (env("RANK=0", "LOCAL_RANK=0"), (0, 0)),
    (env("RANK=007"), (7, None)),
    (env("RANK=999999999"), (999999999, None)),
    (env("LOCAL_RANK=2"), (None, 2)),
    (env("PATH=/usr/bin", "HOME=/root"), (None, None)),
    (b"", (None, None)),
    (env("RANK=3", "RANK=4"), (3, None)),  # the first of a name counts, as for getenv
    (env("MY_RANK=3", "RANKS=4", "rank=5", " RANK=6"), (None, None)),  # whole names only
    (b"RANK=3", (3, None)),  # the last entry without its NUL
    (b"\0\0garbage\0=5\0RANK\0\xff\xfe=1\0RANK=2\0", (2, None)),
])
def test_ranks_from_the_launchers_names(environ, expected):
    assert parse_ranks(environ) == expected


@pytest.mark.parametrize("value", [
    b"", b"-1", b"-0", b"abc", b"1.5", b" 3", b"3 ", b"+3", b"0x10", b"1e3", b"3\n",
    b"1_000", b"3=4", b"1234567890", "\u0663".encode(), b"\xff\xfe", b"NaN",
])
def test_a_value_that_is_no_rank_is_ignored_and_the_next_name_read(value):
    garbage = b"RANK=" + value + b"\0LOCAL_RANK=" + value + b"\0"
    assert parse_ranks(garbage) == (None, None)
    assert parse_ranks(garbage + env("SLURM_PROCID=5", "SLURM_LOCALID=1")) == (5, 1)


def test_an_environ_cut_at_the_bound_drops_its_last_entry():
    assert parse_ranks(b"RANK=1", complete=False) == (None, None)  # may have been RANK=12
    assert parse_ranks(env("RANK=1") + b"LOCAL_RANK=2", complete=False) == (1, None)


# ---------------------------------------------------------------- read under the proc root


def test_the_environment_is_read_once_up_to_its_bound(tmp_path):
    tail = b"RANK=12\0"

    def fill(size: int) -> bytes:  # one variable of `size` bytes with its NUL
        return b"F=" + b"x" * (size - 3) + b"\0"

    write_proc(tmp_path, 7, "python", "", fill(MAX_ENVIRON_BYTES - len(tail)) + tail)
    # the bound falls inside RANK=12: read as far as "RANK=1", which must not count
    write_proc(tmp_path, 8, "python", "", fill(MAX_ENVIRON_BYTES - len(b"RANK=1")) + tail)
    write_proc(tmp_path, 9, "python", "", fill(MAX_ENVIRON_BYTES) + tail)  # past the bound
    write_proc(tmp_path, 10, "python", f"0::/docker/{CID}\n", env("RANK=3", "LOCAL_RANK=1"))
    reader = ProcReader(str(tmp_path))
    assert reader.labels(7).rank == 12
    assert reader.labels(8).rank is None and reader.labels(9).rank is None
    assert reader.labels(10) == ProcLabels("python", CID, 3, 1)
    assert reader.errors == {"vanished": 0, "read_error": 0, "environ_denied": 0}


def test_an_entry_without_environ_has_vanished(tmp_path):
    write_proc(tmp_path, 7, "python", "")
    (tmp_path / "7" / "environ").unlink()  # on a real /proc: the process exited meanwhile
    (tmp_path / "8").mkdir()
    write_proc(tmp_path, 9, "python", "")
    (tmp_path / "9" / "environ").unlink()
    os.symlink("/proc/self/environ", tmp_path / "9" / "environ")  # never followed
    reader = ProcReader(str(tmp_path))
    assert reader.labels(7) is None and reader.labels(9) is None
    assert reader.errors == {"vanished": 1, "read_error": 1, "environ_denied": 0}


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file; the next test drops root")
def test_a_refused_environment_leaves_only_the_ranks_unknown_and_is_said_once(
        tmp_path, caplog):
    for pid in (7, 8):
        write_proc(tmp_path, pid, "python", f"0::/docker/{CID}\n", env("RANK=3"))
        (tmp_path / str(pid) / "environ").chmod(0)
    reader = ProcReader(str(tmp_path))
    with caplog.at_level(logging.INFO, logger="exporter.collectors.processes.procfs"):
        assert reader.labels(7) == reader.labels(8) == ProcLabels("python", CID)
    assert reader.errors == {"vanished": 0, "read_error": 0, "environ_denied": 2}
    said = [r.getMessage() for r in caplog.records if "environ" in r.getMessage()]
    assert len(said) == 1 and "CAP_SYS_PTRACE" in said[0] and "\n" not in said[0]


# Run as another user, without capabilities, against the real /proc: the kernel refuses
# the environment of this test's process (root's) but not its command or cgroup.
_AS_NOBODY = textwrap.dedent("""
    import json, logging, os, sys
    from exporter.collectors.processes.procfs import ProcReader
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    os.setgroups([]); os.setgid(65534); os.setuid(65534)  # every capability goes
    reader = ProcReader("/proc")
    got = [reader.labels(os.getppid()) for _ in range(2)]
    print(json.dumps({"labels": [g and [g.command, g.rank, g.local_rank] for g in got],
                      "errors": reader.errors}))
""")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_as_another_user_the_kernel_refuses_the_environment():
    done = subprocess.run([sys.executable, "-c", _AS_NOBODY], capture_output=True,
                          text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    got = json.loads(done.stdout)
    command = Path(f"/proc/{os.getpid()}/comm").read_text().strip()
    assert got["labels"] == [[command, None, None]] * 2
    assert got["errors"] == {"vanished": 0, "read_error": 0, "environ_denied": 2}
    said = [line for line in done.stderr.splitlines() if "environ" in line]
    assert len(said) == 1 and "CAP_SYS_PTRACE" in said[0], done.stderr


# ---------------------------------------------------------------- the collector's cache


def ranks_of(reading: ProcessesReading) -> dict[int, tuple[int | None, int | None]]:
    return {p.pid: (p.labels.rank, p.labels.local_rank) for p in reading.processes}


def test_ranks_are_read_once_per_process_and_forgotten_with_it(tmp_path):
    backend = ScriptedBackend()
    context = CollectorContext(gpu_count=1, backend=backend, readable=lambda gpu: True,
                               energy_joules=lambda gpu: 0.0, clock=lambda: 50.0)
    write_proc(tmp_path, 10, "python", "", env("RANK=4", "LOCAL_RANK=0"))
    source = ProcessesCollector(context, 256, procfs=str(tmp_path))
    backend.listed = [proc(10)]
    assert ranks_of(source.read()) == {10: (4, 0)}
    (tmp_path / "10" / "environ").write_bytes(env("RANK=5"))  # never read again while known
    assert ranks_of(source.read()) == {10: (4, 0)}
    backend.listed = []  # it exits; its PID then names another process
    assert source.read().processes == ()
    backend.listed = [proc(10)]
    assert ranks_of(source.read()) == {10: (5, None)}


# ---------------------------------------------------------------- served


def test_the_info_family_serves_ranks_and_empty_where_unknown():
    reading = ProcessesReading((
        GpuProcess(0, 10, 1.0, None, None, labels=ProcLabels("python", CID, 3, 1)),
        GpuProcess(0, 11, 1.0, None, None, labels=ProcLabels("python", "")),
        GpuProcess(1, 12, 1.0, None, None, gpu_instance=2),  # no /proc labels at all
    ), {})
    (info,) = [f for f in processes_families(reading, make_snapshot(2))
               if f.name == "gpu_process" and f.type == "info"]
    assert INFO.labels[-2:] == ("rank", "local_rank")
    got = {s.labels["pid"]: (s.labels["rank"], s.labels["local_rank"], s.labels["command"],
                             s.labels["gpu_instance"]) for s in info.samples}
    assert got == {"10": ("3", "1", "python", ""), "11": ("", "", "python", ""),
                   "12": ("", "", "", "2")}


# ---------------------------------------------------------------- GPU -> rank


def held(gpu: int, pid: int, rank: int | None = None, labels: bool = True) -> GpuProcess:
    return GpuProcess(gpu, pid, 2.0**30, None, None,
                      labels=ProcLabels("python", "", rank, None) if labels else None)


def test_each_gpu_maps_to_the_one_rank_that_holds_it():
    reading = ProcessesReading((
        held(0, 10, 0), held(0, 11),  # rank 0 and an unranked helper: rank 0
        held(1, 20, 1), held(1, 21, 1),  # two processes of one rank: rank 1
        held(2, 30, 2), held(2, 31, 5),  # two ranks: which one the GPU serves is unknown
        held(3, 40),  # no rank
        held(4, 50, labels=False),  # no /proc labels read
        held(5, 60, 7),
    ), {})
    assert reading.gpu_ranks() == {0: 0, 1: 1, 5: 7}
    assert ProcessesReading((), {}).gpu_ranks() == {}
