"""GPU-to-job mapping files: parsing, caching, bad input, and the join metric."""

from __future__ import annotations

import os
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors.jobs.families import jobs_families
from exporter.collectors.jobs.reading import (
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_JOBS_PER_GPU,
    MAX_JOBS_PER_NODE,
    BadFile,
    JobsCollector,
    JobsReading,
    parse_gpu_index,
    parse_job_file,
    parse_mapping_name,
)
from exporter.gpu.reading import GpuIdentity
from exporter.metrics.render import render
from exporter.sampling.snapshot import CollectorResult, Snapshot
from tests.tools import make_snapshot, require_binary

# ---------------------------------------------------------------- pure parsing


@pytest.mark.parametrize(("name", "index"), [("0", 0), ("7", 7), ("15", 15)])
def test_gpu_index(name, index):
    assert parse_gpu_index(name, 16) == index


@pytest.mark.parametrize(("name", "reason"), [
    ("x", "bad_name"), ("-1", "bad_name"), ("01", "bad_name"), ("1.0", "bad_name"),
    ("", "bad_name"), ("٣", "bad_name"), ("1 ", "bad_name"), ("0x1", "bad_name"),
    ("8", "out_of_range"), ("99999999", "out_of_range"),
])
def test_bad_gpu_index(name, reason):
    with pytest.raises(BadFile) as exc:
        parse_gpu_index(name, 8)
    assert exc.value.reason == reason


def test_gpu_index_without_a_gpu_count_is_still_bounded():
    assert parse_gpu_index("4095") == 4095
    with pytest.raises(BadFile, match="out_of_range"):
        parse_gpu_index("4096")


@pytest.mark.parametrize(("name", "key"), [("0", (0, None)), ("7", (7, None)),
                                         ("0.1", (0, 1)), ("3.0", (3, 0)), ("7.63", (7, 63))])
def test_mapping_names_are_gpus_or_mig_instances(name, key):
    assert parse_mapping_name(name, 8) == key


@pytest.mark.parametrize(("name", "reason"), [
    ("1.", "bad_name"), (".1", "bad_name"), ("1.01", "bad_name"), ("1.1.1", "bad_name"),
    ("1.x", "bad_name"), ("01.1", "bad_name"), ("1.-1", "bad_name"), ("1.1 ", "bad_name"),
    ("1.٣", "bad_name"), ("8.1", "out_of_range"), ("1.64", "out_of_range"),
])
def test_bad_mapping_names(name, reason):
    with pytest.raises(BadFile) as exc:
        parse_mapping_name(name, 8)
    assert exc.value.reason == reason


@pytest.mark.parametrize(("raw", "jobs"), [
    (b"1234\n", ("1234",)),
    (b"1234", ("1234",)),  # no final newline
    (b"1234\n5678\n", ("1234", "5678")),
    (b"  1234 \r\n\n5678_2\n1234\n", ("1234", "5678_2")),  # blanks, CRLF, repeats
    (b"123+0\n", ("123+0",)),  # heterogeneous job component
])
def test_job_file(raw, jobs):
    assert parse_job_file(raw) == jobs


@pytest.mark.parametrize(("raw", "reason"), [
    (b"", "empty"), (b"\n \n\t\n", "empty"),
    (b"1" * 129 + b"\n", "line_too_long"),
    (b"12\x0034\n", "garbage"), (b"\xff\xfe\x00\x01", "garbage"), (b"caf\xc3\xa9\n", "garbage"),
    (b"12 34\n", "garbage"), (b"12\x1b[31m\n", "garbage"),
    (b"1\n" * (MAX_FILE_BYTES // 2 + 1), "too_large"),
])
def test_bad_job_file(raw, reason):
    with pytest.raises(BadFile) as exc:
        parse_job_file(raw)
    assert exc.value.reason == reason


# ---------------------------------------------------------------- the source


def skipped(reading: JobsReading) -> dict[str, int]:
    return {r: n for r, n in reading.skipped_total.items() if n}


def test_reads_the_mapping(tmp_path):
    (tmp_path / "0").write_text("101\n")
    (tmp_path / "1").write_text("101\n102\n")
    (tmp_path / "10").write_text("103\n")
    (tmp_path / ".1.tmp.123").write_text("junk")  # the scripts' temporaries: ignored
    reading = JobsCollector(tmp_path, gpu_count=16).read()
    assert list(reading.jobs.items()) == [(0, ("101",)), (1, ("101", "102")), (10, ("103",))]
    assert skipped(reading) == {}


def test_missing_directory_means_no_jobs(tmp_path):
    reading = JobsCollector(tmp_path / "absent").read()
    assert dict(reading.jobs) == {} and skipped(reading) == {}


def test_a_mapping_path_that_is_a_file_is_a_failure(tmp_path):
    """Reporting success (no jobs) would hide the mistake."""
    (tmp_path / "file").write_text("0\n")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        JobsCollector(tmp_path / "file").read()


def test_a_mapping_dir_that_is_a_file_shows_as_a_failing_source(tmp_path, running_exporter):
    (tmp_path / "file").write_text("")
    exp = running_exporter.start(manual=True, hpc_job_mapping_dir=str(tmp_path / "file"))
    result = exp.sampler.snapshot.collectors["jobs"]
    assert not result.success and "not a directory" in result.error
    assert b'cte_source_success{source="jobs"} 0.0' in exp.current.body


def test_symbolic_links_are_never_followed(tmp_path):
    """jobs/0 -> /elsewhere/secret must not export the secret as a label."""
    secret = tmp_path / "secret"
    secret.write_text("hunter2\n")
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "0").symlink_to(secret)
    (mapping / "real").write_text("101\n")
    (mapping / "1").symlink_to(mapping / "real")  # even inside the directory
    (mapping / "2").write_text("102\n")
    source = JobsCollector(mapping, gpu_count=4)
    reading = source.read()
    assert dict(reading.jobs) == {2: ("102",)}
    assert skipped(reading) == {"symlink": 2, "bad_name": 1}
    assert b"hunter2" not in render(snapshot(reading, gpus=4))


def test_a_link_swapped_in_after_the_check_is_not_followed(tmp_path, monkeypatch):
    secret = tmp_path / "secret"
    secret.write_text("hunter2\n")
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "0").symlink_to(secret)
    real_lstat = os.lstat
    # lstat sees a plain file (the race: swapped for a link right after)
    monkeypatch.setattr(os, "lstat", lambda p: real_lstat(secret) if str(p).endswith("/0")
                        else real_lstat(p))
    reading = JobsCollector(mapping, gpu_count=1).read()
    assert dict(reading.jobs) == {} and skipped(reading) == {"symlink": 1}


def test_job_ids_are_capped_per_gpu_and_per_node(tmp_path):
    """One 4 KB file must not yield a thousand series."""
    (tmp_path / "0").write_text("".join(f"{i}\n" for i in range(1000)))  # under 4 KiB
    reading = JobsCollector(tmp_path, gpu_count=32).read()
    assert reading.jobs[0] == tuple(str(i) for i in range(MAX_JOBS_PER_GPU))  # first ones
    assert dict(reading.dropped_total) == {"per_gpu": 1000 - MAX_JOBS_PER_GPU, "per_node": 0}
    for gpu in range(1, 32):
        (tmp_path / str(gpu)).write_text("".join(f"{gpu}-{i}\n" for i in range(20)))
    source = JobsCollector(tmp_path, gpu_count=32)
    reading = source.read()
    assert sum(len(jobs) for jobs in reading.jobs.values()) == MAX_JOBS_PER_NODE
    kept_gpus = sorted(reading.jobs)
    assert kept_gpus == list(range(MAX_JOBS_PER_NODE // MAX_JOBS_PER_GPU))  # lowest first
    per_node = 32 * MAX_JOBS_PER_GPU - MAX_JOBS_PER_NODE
    assert dict(reading.dropped_total) == {"per_gpu": 984 + 31 * 4, "per_node": per_node}
    assert source.read().dropped_total["per_node"] == 2 * per_node  # every pass
    text = render(snapshot(reading, gpus=32)).decode()
    assert text.count("gpu_hpc_job_info{") == MAX_JOBS_PER_NODE
    assert f'cte_hpc_job_ids_dropped_total{{reason="per_node"}} {per_node}.0' in text


class _Entry:
    def __init__(self, name: str):
        self.name = name


class _Listing:
    """os.scandir stand-in listing names in a given order (as a file system may)."""

    def __init__(self, names: list[str]):
        self.names = names

    def __enter__(self):
        return iter([_Entry(n) for n in self.names])

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("gpu_count", [4, None])
def test_which_gpus_are_mapped_does_not_depend_on_listing_order(tmp_path, monkeypatch,
                                                               gpu_count):
    """Past the entries read, which GPUs are mapped must not be the file system's pick:
    junk listed first must not hide a GPU's file."""
    monkeypatch.setattr("exporter.collectors.jobs.reading.MAX_ENTRIES", 10)
    for gpu in range(4):
        (tmp_path / str(gpu)).write_text(f"{100 + gpu}\n")
    junk = [f"junk{i}" for i in range(30)]
    for name in junk:
        (tmp_path / name).write_text("x\n")
    for order in (junk + ["3", "2", "1", "0"], ["0", "1", "2", "3"] + junk):
        monkeypatch.setattr("exporter.collectors.jobs.reading.os.scandir",
                            lambda _path, order=order: _Listing(order))
        reading = JobsCollector(tmp_path, gpu_count=gpu_count).read()
        assert dict(reading.jobs) == {g: (str(100 + g),) for g in range(4)}, order
        assert reading.skipped_total["too_many_files"] == 1


def test_reads_a_file_again_only_when_it_changes(tmp_path, monkeypatch):
    path = tmp_path / "0"
    path.write_text("101\n")
    source = JobsCollector(tmp_path, gpu_count=8)
    opened = []
    real_open = os.open

    def counting_open(p, *args, **kwargs):
        opened.append(os.fspath(p))
        return real_open(p, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    assert source.read().jobs == {0: ("101",)}
    assert source.read().jobs == {0: ("101",)}
    assert opened == [str(path)]  # the second pass used the cache
    # same size, same mtime, but replaced by rename (as the scripts do): a new inode
    stat = path.stat()
    (tmp_path / ".new").write_text("102\n")
    os.utime(tmp_path / ".new", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.rename(tmp_path / ".new", path)
    assert source.read().jobs == {0: ("102",)}
    # rewritten in place with a new mtime
    path.write_text("103\n104\n")
    assert source.read().jobs == {0: ("103", "104")}
    assert len(opened) == 3
    path.unlink()
    assert source.read().jobs == {}


def test_bad_files_are_skipped_and_counted_on_every_pass(tmp_path):
    (tmp_path / "0").write_text("101\n")
    (tmp_path / "1").write_text("")  # empty
    (tmp_path / "2").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))  # binary
    (tmp_path / "3").write_text("9" * 1000 + "\n")  # overlong line
    (tmp_path / "4").write_bytes(b"1\n" * 5000)  # too large
    (tmp_path / "5").mkdir()  # not a file
    os.mkfifo(tmp_path / "6")  # a FIFO must not block the read
    (tmp_path / "9").write_text("102\n")  # past the GPU count
    (tmp_path / "gpu0").write_text("102\n")
    (tmp_path / "-1").write_text("102\n")
    (tmp_path / "00").write_text("102\n")
    source = JobsCollector(tmp_path, gpu_count=8)
    reading = source.read()
    assert dict(reading.jobs) == {0: ("101",)}
    expected = {"empty": 1, "garbage": 1, "line_too_long": 1, "too_large": 1,
                "not_a_file": 2, "out_of_range": 1, "bad_name": 3}
    assert skipped(reading) == expected
    reading = source.read()  # still there: counted again (from the cache)
    assert skipped(reading) == {reason: 2 * n for reason, n in expected.items()}


def test_unreadable_file_is_a_read_error_and_retried(tmp_path, monkeypatch):
    (tmp_path / "0").write_text("101\n")
    source = JobsCollector(tmp_path, gpu_count=8)
    real_open = os.open

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", denied)
    reading = source.read()
    assert dict(reading.jobs) == {} and skipped(reading) == {"read_error": 1}
    monkeypatch.setattr(os, "open", real_open)  # fixed without touching the file
    assert dict(source.read().jobs) == {0: ("101",)}


def test_jobs_are_peer_groups_where_a_gpu_runs_one_job():
    reading = JobsReading(jobs={0: ("101",), 1: ("101", "102"), 2: ("103",)},
                          skipped_total={})
    assert reading.gpu_groups() == {0: "101", 2: "103"}


def test_gpu_count_comes_from_the_sampler(tmp_path):
    (tmp_path / "3").write_text("101\n")
    source = JobsCollector(tmp_path)
    assert dict(source.read().jobs) == {3: ("101",)}
    source.set_gpu_count(2)
    reading = source.read()
    assert dict(reading.jobs) == {} and skipped(reading) == {"out_of_range": 1}


def test_file_count_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr("exporter.collectors.jobs.reading.MAX_FILES", 3)
    for gpu in range(5):
        (tmp_path / str(gpu)).write_text(f"{gpu}\n")
    reading = JobsCollector(tmp_path).read()
    assert sorted(reading.jobs) == [0, 1, 2]  # the lowest indices
    assert skipped(reading) == {"too_many_files": 2}
    assert MAX_FILES >= 64


# ---------------------------------------------------------------- the join metric


def ident(index: int) -> GpuIdentity:
    return GpuIdentity(index, f"GPU-{index:08d}", "NVIDIA H100", f"0000:{index:02x}:00.0", "")


def snapshot(reading: JobsReading | None, gpus: int = 2) -> Snapshot:
    collectors = {} if reading is None else {"jobs": CollectorResult(reading, 0.001, True, 0)}
    return make_snapshot(gpus, collectors=collectors)


def test_join_metric_one_series_per_job(tmp_path):
    (tmp_path / "0").write_text("101\n")
    (tmp_path / "1").write_text("101\n102\n")
    (tmp_path / "x").write_text("")
    snap = snapshot(JobsCollector(tmp_path, gpu_count=2).read())
    text = render(snap).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    info = fams["gpu_hpc_job_info"]  # the text format has no info type: a gauge
    assert sorted((s.labels["gpu"], s.labels["uuid"], s.labels["hpc_job"], s.value)
                  for s in info.samples) == [
        ("0", "GPU-00000000", "101", 1.0), ("1", "GPU-00000001", "101", 1.0),
        ("1", "GPU-00000001", "102", 1.0)]
    assert all("job" not in s.labels for s in info.samples)
    skipped_ = {s.labels["reason"]: s.value for s in fams["cte_hpc_job_skipped_files"].samples}
    assert skipped_["bad_name"] == 1 and skipped_["garbage"] == 0


def test_no_jobs_collector_no_families():
    assert "gpu_hpc_job" not in render(snapshot(None)).decode()


def test_gpu_without_identity_has_no_join_series():
    reading = JobsReading(jobs={0: ("101",), 1: ("102",)}, skipped_total={})
    snap = snapshot(reading, gpus=2)
    snap = Snapshot(**{**snap.__dict__, "identities": (ident(0), None)})
    (info, _, _) = list(jobs_families(reading, snap))
    assert [s.labels["hpc_job"] for s in info.samples] == ["101"]


def test_promtool_accepts_the_jobs_output(tmp_path):
    promtool = require_binary("promtool")
    (tmp_path / "0").write_text('101\n"quoted"\\n\n')
    (tmp_path / "1").write_text("101\n102\n")
    body = render(snapshot(JobsCollector(tmp_path, gpu_count=2).read()))
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()


def test_mig_instance_files_map_jobs_to_instances(tmp_path):
    (tmp_path / "0").write_text("101\n")
    (tmp_path / "1.1").write_text("201\n")
    (tmp_path / "1.13").write_text("202\n203\n")
    (tmp_path / "1.02").write_text("204\n")  # not canonical
    (tmp_path / "9.1").write_text("205\n")  # no such GPU
    reading = JobsCollector(tmp_path, gpu_count=2).read()
    assert dict(reading.jobs) == {0: ("101",)}
    assert dict(reading.instance_jobs) == {(1, 1): ("201",), (1, 13): ("202", "203")}
    assert skipped(reading) == {"bad_name": 1, "out_of_range": 1}
    assert reading.gpu_groups() == {0: "101"}  # instances are no whole GPU's peers
    info = next(jobs_families(reading, snapshot(reading)))
    assert [(s.labels["gpu"], s.labels["gpu_instance"], s.labels["hpc_job"])
            for s in info.samples] == [("0", "", "101"), ("1", "1", "201"), ("1", "13", "202"),
                                       ("1", "13", "203")]


def test_the_per_node_cap_spans_gpus_and_instances(tmp_path, monkeypatch):
    import exporter.collectors.jobs.reading as jobs

    monkeypatch.setattr(jobs, "MAX_JOBS_PER_NODE", 3)
    (tmp_path / "0").write_text("a\nb\n")
    (tmp_path / "0.1").write_text("c\nd\n")
    (tmp_path / "1").write_text("e\n")
    reading = JobsCollector(tmp_path, gpu_count=2).read()
    assert dict(reading.jobs) == {0: ("a", "b")}  # the whole GPU's file first, then its
    assert dict(reading.instance_jobs) == {(0, 1): ("c",)}  # instances', then GPU 1
    assert reading.dropped_total["per_node"] == 2
