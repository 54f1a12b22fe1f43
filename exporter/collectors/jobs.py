"""Which job holds which GPU, from a directory of mapping files (dcgm-exporter's format).

The directory (``--hpc-job-mapping-dir``) holds one file per GPU, named after the NVML
GPU index (``0``, ``1``, ...), with one job id per line; several lines mean several
jobs share the GPU. The Slurm prolog and epilog in ``deploy/slurm/`` write and remove
them. Names that start with ``.`` are ignored (the scripts' temporary and lock files).

Reading and parsing are apart: :func:`parse_gpu_index` and :func:`parse_job_file` are
pure. :class:`JobsSource` lists the directory, and reads a file again only when its
``(mtime_ns, size, inode)`` changed; anything unusable (a name that is not a GPU
index, an index past the GPU count, an empty, oversized, binary or unreadable file, a
FIFO, an overlong line) is skipped alone and counted by reason on every read pass it
is still there, so ``rate()`` of the counter is above zero for as long as a bad file
stays. Reads are bounded: at most :data:`MAX_FILES` files per pass and
:data:`MAX_FILE_BYTES` bytes per file.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from exporter.collectors.registry import CollectorSpec
from exporter.options import Option

__all__ = [
    "MAX_FILES",
    "MAX_FILE_BYTES",
    "MAX_JOB_ID_CHARS",
    "SKIP_REASONS",
    "BadFile",
    "JobsReading",
    "JobsSource",
    "parse_gpu_index",
    "parse_job_file",
]

#: Files read per pass at most (a node has a few GPUs; the rest is counted, not read).
MAX_FILES = 256
#: Directory entries looked at per pass at most.
MAX_ENTRIES = 4096
#: Bytes read per file at most; a larger file is skipped as ``too_large``.
MAX_FILE_BYTES = 4096
#: Longest job id accepted (Slurm ids such as ``123456_7`` or ``123456+1`` are short).
MAX_JOB_ID_CHARS = 128
#: Highest GPU index accepted in a file name when the GPU count is not known.
MAX_GPU_INDEX = 4095

#: Every reason a file can be skipped for (the self-metric's ``reason`` label).
SKIP_REASONS = (
    "bad_name",  # not a GPU index: not a canonical non-negative decimal integer
    "out_of_range",  # an index at or past the number of GPUs NVML reports
    "not_a_file",  # a directory, FIFO, socket or device
    "empty",  # no job id in it
    "too_large",  # more than MAX_FILE_BYTES bytes
    "line_too_long",  # a job id longer than MAX_JOB_ID_CHARS
    "garbage",  # binary, not UTF-8/ASCII, or a job id with spaces or control characters
    "read_error",  # open/read failed (EACCES, EIO, ...)
    "vanished",  # listed, then gone before it could be read
    "too_many_files",  # past MAX_FILES (or the directory past MAX_ENTRIES entries)
)

_INDEX_RE = re.compile(r"(?:0|[1-9][0-9]{0,8})\Z")
_JOB_ID_RE = re.compile(r"[\x21-\x7e]+\Z")  # visible ASCII, no spaces


class BadFile(ValueError):
    """A mapping file that cannot be used; ``reason`` is one of :data:`SKIP_REASONS`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------- pure parsing


def parse_gpu_index(name: str, gpu_count: int | None = None) -> int:
    """A file name -> GPU index; ``bad_name`` or ``out_of_range`` otherwise."""
    if not name.isascii() or _INDEX_RE.match(name) is None:
        raise BadFile("bad_name")
    index = int(name)
    limit = MAX_GPU_INDEX + 1 if gpu_count is None else gpu_count
    if index >= limit:
        raise BadFile("out_of_range")
    return index


def parse_job_file(raw: bytes) -> tuple[str, ...]:
    """A file's bytes -> its job ids, in file order without repeats."""
    if len(raw) > MAX_FILE_BYTES:
        raise BadFile("too_large")
    if b"\0" in raw:
        raise BadFile("garbage")
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise BadFile("garbage") from None
    jobs: dict[str, None] = {}
    for line in text.splitlines():
        job = line.strip()
        if not job:
            continue
        if len(job) > MAX_JOB_ID_CHARS:
            raise BadFile("line_too_long")
        if _JOB_ID_RE.match(job) is None:
            raise BadFile("garbage")
        jobs[job] = None
    if not jobs:
        raise BadFile("empty")
    return tuple(jobs)


# ---------------------------------------------------------------- values


@dataclass(frozen=True)
class JobsReading:
    #: GPU index -> job ids holding it (only GPUs with a usable file).
    jobs: Mapping[int, tuple[str, ...]]
    #: Cumulative skipped files by reason (counted on every pass a bad file is there).
    skipped_total: Mapping[str, int]

    def gpu_groups(self) -> dict[int, str]:
        """GPU -> its job, for the GPUs that run exactly one (peer groups for the
        straggler analysis)."""
        return {gpu: ids[0] for gpu, ids in self.jobs.items() if len(ids) == 1}


# ---------------------------------------------------------------- reading

_Key = tuple[int, int, int]  # (mtime_ns, size, inode)


def _read_bounded(path: str) -> tuple[_Key, bytes]:
    """Open without blocking (a FIFO must not hang us), check it is a file, read it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadFile("not_a_file")
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if st.st_size > MAX_FILE_BYTES:
            raise BadFile("too_large")
        chunks, left = [], MAX_FILE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return key, b"".join(chunks)
    finally:
        os.close(fd)


class JobsSource:
    """Reads the GPU -> job mapping files in ``directory``."""

    name = "jobs"

    def __init__(self, directory: str | os.PathLike[str], gpu_count: int | None = None) -> None:
        self.directory = os.fspath(directory)
        self.gpu_count = gpu_count
        self._cache: dict[str, tuple[_Key, tuple[str, ...] | str]] = {}
        self._skipped: dict[str, int] = dict.fromkeys(SKIP_REASONS, 0)
        self._lock = threading.Lock()

    def set_gpu_count(self, count: int) -> None:
        """Called by the sampler once NVML is open: indices past it are ``out_of_range``."""
        self.gpu_count = count

    def read(self) -> JobsReading:
        with self._lock:
            skipped: dict[str, int] = {}
            jobs: dict[int, tuple[str, ...]] = {}
            seen: dict[str, tuple[_Key, tuple[str, ...] | str]] = {}
            files = 0
            for name in self._names(skipped):
                try:
                    index = parse_gpu_index(name, self.gpu_count)
                except BadFile as exc:
                    skipped[exc.reason] = skipped.get(exc.reason, 0) + 1
                    continue
                files += 1
                if files > MAX_FILES:
                    skipped["too_many_files"] = skipped.get("too_many_files", 0) + 1
                    continue
                result = self._file(name, seen)
                if isinstance(result, str):
                    skipped[result] = skipped.get(result, 0) + 1
                else:
                    jobs[index] = result
            self._cache = seen
            for reason, count in skipped.items():
                self._skipped[reason] = self._skipped.get(reason, 0) + count
            total = MappingProxyType(dict(self._skipped))
        return JobsReading(jobs=MappingProxyType(dict(sorted(jobs.items()))),
                           skipped_total=total)

    def _names(self, skipped: dict[str, int]) -> list[str]:
        """Visible names in the directory, sorted; none if it is not there (yet)."""
        names: list[str] = []
        try:
            with os.scandir(self.directory) as entries:
                for count, entry in enumerate(entries):
                    if count >= MAX_ENTRIES:
                        skipped["too_many_files"] = skipped.get("too_many_files", 0) + 1
                        break
                    if not entry.name.startswith("."):
                        names.append(entry.name)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError:
            skipped["read_error"] = skipped.get("read_error", 0) + 1
            return []
        names.sort(key=lambda n: (len(n), n))  # numeric order for canonical indices
        return names

    def _file(self, name: str,
              seen: dict[str, tuple[_Key, tuple[str, ...] | str]]) -> tuple[str, ...] | str:
        """The file's job ids, or the reason it was skipped (cached while unchanged)."""
        path = os.path.join(self.directory, name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return "vanished"
        except OSError:
            return "read_error"
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        cached = self._cache.get(name)
        if cached is not None and cached[0] == key:
            seen[name] = cached
            return cached[1]
        try:
            key, raw = _read_bounded(path)
            result: tuple[str, ...] | str = parse_job_file(raw)
        except BadFile as exc:
            result = exc.reason
        except FileNotFoundError:
            return "vanished"  # not cached: looked at again next pass
        except OSError:
            return "read_error"  # not cached: permissions may be fixed without a write
        seen[name] = (key, result)
        return result


def _mapping_dir_problem(text: str) -> str | None:
    return None if text.strip() else ("expected a directory path (leave unset to turn the "
                                      "jobs collector off)")


def _families(reading: JobsReading, snapshot: object):
    from exporter.collectors.jobs_families import jobs_families

    return jobs_families(reading, snapshot)


SPEC = CollectorSpec(
    name="jobs",
    help="which job holds which GPU, from dcgm-exporter-style mapping files "
    "(default: on when --hpc-job-mapping-dir is set)",
    default=lambda config: config.hpc_job_mapping_dir is not None,
    factory=lambda config, context: JobsSource(config.hpc_job_mapping_dir, context.gpu_count),
    families=_families,
    options=(Option("hpc_job_mapping_dir", "--hpc-job-mapping-dir", str, None,
                    "directory of GPU-to-job files as dcgm-exporter reads them (one file per "
                    "GPU index, one job id per line); unset: off", metavar="DIR",
                    optional=True, check=_mapping_dir_problem),),
    requirement=lambda config: None if config.hpc_job_mapping_dir else (
        "needs --hpc-job-mapping-dir"),
)
