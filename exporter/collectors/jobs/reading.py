"""Which job holds which GPU, from a directory of mapping files (dcgm-exporter's format).

The directory (``--hpc-job-mapping-dir``) holds one file per GPU, named after the NVML
GPU index (``0``, ``1``, ...), with one job id per line; several lines mean several
jobs share the GPU. A MIG instance has a file of its own named ``GPU.INSTANCE`` after
its GPU index and GPU instance id (``0.1``), as dcgm-exporter reads them; its jobs carry
the instance in :attr:`JobsReading.instance_jobs`. The Slurm prolog and epilog in
``deploy/slurm/`` write and remove them. Names that start with ``.`` are ignored (the
scripts' temporary and lock files).

Reading and parsing are apart: :func:`parse_mapping_name` and :func:`parse_job_file` are
pure. :class:`JobsCollector` lists the directory, and reads a file again only when its
``(mtime_ns, size, inode)`` changed; anything unusable (a name that is not a GPU
index, an index past the GPU count, a symbolic link, an empty, oversized, binary or
unreadable file, a FIFO, an overlong line) is skipped alone and counted by reason on
every read pass it is still there, so ``rate()`` of the counter is above zero for as
long as a bad file stays.

Everything is bounded, because whoever can write the directory (a job's prolog, a
compromised account) must not be able to make the exporter read elsewhere or export
without bound:

- symbolic links are never followed (``lstat`` and ``O_NOFOLLOW``): ``0 -> /etc/secret``
  would otherwise export the secret's lines as job labels;
- at most :data:`MAX_FILE_BYTES` bytes per file, :data:`MAX_JOBS_PER_GPU` job ids per
  file (one file is one GPU) and :data:`MAX_JOBS_PER_NODE` per pass; ids past a cap are
  dropped, first ones kept in file order, and counted (:attr:`JobsReading.dropped_total`);
- at most :data:`MAX_FILES` files and :data:`MAX_ENTRIES` directory entries per pass.
  Which GPUs get mapped never depends on the file system's listing order: files are
  taken by GPU index, lowest first, and when the listing stops at the entry cap each
  GPU's file is looked up by name instead.

Beside the GPU files, ``.jobs/<job id>`` (written by the Slurm prolog; the hidden
directory is never listed as a GPU file) gives a job's user, account and partition
(:mod:`exporter.collectors.jobs.attributes`); a job without one has them empty, so
mapping files written by anything else keep working unchanged.

A mapping path that is not a directory (a regular file, say) or cannot be listed makes
:meth:`JobsCollector.read` raise, so the source reports failure; a missing directory is
no jobs yet (the prolog creates it).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from exporter.sampling.collector_api import JobGrouping, JobHolders

__all__ = [
    "DROP_REASONS",
    "MAX_FILES",
    "MAX_FILE_BYTES",
    "MAX_JOBS_PER_GPU",
    "MAX_JOBS_PER_NODE",
    "MAX_JOB_ID_CHARS",
    "SKIP_REASONS",
    "BadFile",
    "JobAttributes",
    "JobsReading",
    "JobsCollector",
    "parse_gpu_index",
    "parse_mapping_name",
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
#: Highest GPU instance id accepted in a ``GPU.INSTANCE`` name (NVML's are below 15).
MAX_GPU_INSTANCE = 63
#: Job ids kept per file, that is per GPU (a GPU shared by more jobs is an anomaly).
MAX_JOBS_PER_GPU = 16
#: Job ids kept per read pass over the whole directory (gpu_hpc_job_info series).
MAX_JOBS_PER_NODE = 256

#: Every reason a file can be skipped for (the self-metric's ``reason`` label).
SKIP_REASONS = (
    "bad_name",  # not GPU or GPU.INSTANCE in canonical non-negative decimal integers
    "out_of_range",  # an index at or past the number of GPUs NVML reports, or an
    # instance id past MAX_GPU_INSTANCE
    "not_a_file",  # a directory, FIFO, socket or device
    "empty",  # no job id in it
    "too_large",  # more than MAX_FILE_BYTES bytes
    "line_too_long",  # a job id longer than MAX_JOB_ID_CHARS
    "garbage",  # binary, not UTF-8/ASCII, or a job id with spaces or control characters
    "symlink",  # a symbolic link: never followed
    "read_error",  # open/read failed (EACCES, EIO, ...)
    "vanished",  # listed, then gone before it could be read
    "too_many_files",  # past MAX_FILES (or the directory past MAX_ENTRIES entries)
)

#: Why job ids were dropped (the ``reason`` label of the dropped-ids self-metric).
DROP_REASONS = (
    "per_gpu",  # past MAX_JOBS_PER_GPU in one file
    "per_node",  # past MAX_JOBS_PER_NODE in one pass
)

_INDEX_RE = re.compile(r"(?:0|[1-9][0-9]{0,8})\Z")
_NAME_RE = re.compile(r"(0|[1-9][0-9]{0,8})(?:\.(0|[1-9][0-9]{0,8}))?\Z")
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


def parse_mapping_name(name: str, gpu_count: int | None = None) -> tuple[int, int | None]:
    """A file name -> (GPU index, GPU instance id or None for the whole GPU): ``3`` or
    ``3.1``; ``bad_name`` or ``out_of_range`` otherwise."""
    match = _NAME_RE.match(name) if name.isascii() else None
    if match is None:
        raise BadFile("bad_name")
    index = parse_gpu_index(match.group(1), gpu_count)
    if match.group(2) is None:
        return index, None
    instance = int(match.group(2))
    if instance > MAX_GPU_INSTANCE:
        raise BadFile("out_of_range")
    return index, instance


def ascii_text(raw: bytes) -> str:
    """A mapping or attribute file's text: plain ASCII, no NUL, else BadFile("garbage")."""
    if b"\0" in raw:
        raise BadFile("garbage")
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise BadFile("garbage") from None


def parse_job_file(raw: bytes) -> tuple[str, ...]:
    """A file's bytes -> its job ids, in file order without repeats."""
    if len(raw) > MAX_FILE_BYTES:
        raise BadFile("too_large")
    text = ascii_text(raw)
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
class JobAttributes:
    """Who runs a job, as Slurm names them ("" where not recorded)."""

    user: str = ""
    account: str = ""
    partition: str = ""


@dataclass(frozen=True)
class JobsReading(JobGrouping, JobHolders):
    #: GPU index -> job ids holding it (only GPUs with a usable file).
    jobs: Mapping[int, tuple[str, ...]]
    #: Cumulative skipped files by reason (counted on every pass a bad file is there).
    skipped_total: Mapping[str, int]
    #: Cumulative job ids dropped at a cap, by reason (counted on every pass, likewise).
    dropped_total: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    #: (GPU index, GPU instance id) -> job ids, from MIG instances' ``GPU.INSTANCE`` files.
    instance_jobs: Mapping[tuple[int, int], tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({}))
    #: Job id -> its user, account and partition, for the jobs that have them.
    attributes: Mapping[str, JobAttributes] = field(
        default_factory=lambda: MappingProxyType({}))

    def jobs_by_gpu(self) -> Mapping[int, tuple[str, ...]]:
        return self.jobs

    def gpu_groups(self) -> dict[int, str]:
        """GPU -> its job, for the whole GPUs that run exactly one (peer groups for the
        straggler analysis; a MIG GPU's instances are not its peers' equals)."""
        return {gpu: ids[0] for gpu, ids in self.jobs.items() if len(ids) == 1}


# ---------------------------------------------------------------- reading

_Key = tuple[int, int, int]  # (mtime_ns, size, inode)
_Name = tuple[int, int | None]  # (GPU index, GPU instance id or None)


def _file_name(key: _Name) -> str:
    return str(key[0]) if key[1] is None else f"{key[0]}.{key[1]}"


def _order(key: _Name) -> tuple[int, int]:
    """The whole GPU's file first, then its instances'."""
    return key[0], -1 if key[1] is None else key[1]


class _Symlink(Exception):
    """open() met a symbolic link (ELOOP under O_NOFOLLOW)."""


def _read_bounded(path: str) -> tuple[_Key, bytes]:
    """Open without blocking (a FIFO must not hang us) or following a symbolic link
    (swapped in since the lstat), check it is a file, read it."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Symlink(path) from None
        raise
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


T = TypeVar("T")


def read_cached(path: str, name: str, cache: Mapping[str, tuple[_Key, T | str]],
                seen: dict[str, tuple[_Key, T | str]], parse: Callable[[bytes], T],
                missing: T | str | None) -> T | str | None:
    """A small file's parsed content, or the reason it was skipped, parsed again only when
    its (mtime_ns, size, inode) changed; `missing` where it is not there (never cached, so
    looked at again next pass, as a read error is: permissions may be fixed without a
    write). What was read goes into `seen`, the next pass's cache."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return missing
    except OSError:
        return "read_error"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    key = (st.st_mtime_ns, st.st_size, st.st_ino)
    cached = cache.get(name)
    if cached is not None and cached[0] == key:
        seen[name] = cached
        return cached[1]
    try:
        key, raw = _read_bounded(path)
        result: T | str = parse(raw)
    except BadFile as exc:
        result = exc.reason
    except _Symlink:
        return "symlink"
    except FileNotFoundError:
        return missing
    except OSError:
        return "read_error"
    seen[name] = (key, result)
    return result


class _Pass:
    """One read pass: the jobs kept, and what was skipped or dropped, by reason."""

    def __init__(self) -> None:
        self.jobs: dict[int, tuple[str, ...]] = {}
        self.instance_jobs: dict[tuple[int, int], tuple[str, ...]] = {}
        self.kept = 0
        self.skipped: dict[str, int] = {}
        self.dropped: dict[str, int] = {}

    def skip(self, reason: str, count: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + count

    def add(self, key: _Name, jobs: tuple[str, ...]) -> None:
        """Keep the first ids within both caps; count the rest."""
        over_gpu = max(0, len(jobs) - MAX_JOBS_PER_GPU)
        jobs = jobs[:MAX_JOBS_PER_GPU]
        over_node = max(0, self.kept + len(jobs) - MAX_JOBS_PER_NODE)
        jobs = jobs[:len(jobs) - over_node]
        for reason, count in (("per_gpu", over_gpu), ("per_node", over_node)):
            if count:
                self.dropped[reason] = self.dropped.get(reason, 0) + count
        if jobs:
            index, instance = key
            if instance is None:
                self.jobs[index] = jobs
            else:
                self.instance_jobs[(index, instance)] = jobs
            self.kept += len(jobs)


def _accumulate(totals: dict[str, int], counts: dict[str, int]) -> None:
    for reason, count in counts.items():
        totals[reason] = totals.get(reason, 0) + count


class JobsCollector:
    """Reads the GPU -> job mapping files in ``directory``."""

    name = "jobs"

    def __init__(self, directory: str | os.PathLike[str], gpu_count: int | None = None,
                 attributes: Callable[[list[str], dict[str, int]],
                                      dict[str, JobAttributes]] | None = None) -> None:
        """`attributes(job ids, skipped)`: their user, account and partition (counting
        unusable files into `skipped` by reason); None: none are read."""
        self.directory = os.fspath(directory)
        self.gpu_count = gpu_count
        self.attributes = attributes
        self._cache: dict[str, tuple[_Key, tuple[str, ...] | str]] = {}
        self._skipped: dict[str, int] = dict.fromkeys(SKIP_REASONS, 0)
        self._dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self._lock = threading.Lock()

    def set_gpu_count(self, count: int) -> None:
        """Called by the sampler once NVML is open: indices past it are ``out_of_range``."""
        self.gpu_count = count

    def read(self) -> JobsReading:
        """Raises OSError if the mapping path is not a listable directory."""
        with self._lock:
            pass_ = _Pass()
            names, complete = self._names(pass_)
            if not complete:
                # The listing stopped at MAX_ENTRIES, in the file system's order, so which
                # GPU files it saw is arbitrary: look each GPU's file up by name instead
                # (whole GPUs' files only: MIG instance files need a complete listing).
                limit = self.gpu_count if self.gpu_count is not None else MAX_FILES
                names = [(index, None) for index in range(min(limit, MAX_FILES))]
            seen: dict[str, tuple[_Key, tuple[str, ...] | str]] = {}
            for count, key in enumerate(names):
                if count >= MAX_FILES:
                    pass_.skip("too_many_files")
                    continue
                result = self._file(_file_name(key), seen, listed=complete)
                if isinstance(result, str):
                    pass_.skip(result)
                elif result:
                    pass_.add(key, result)
            self._cache = seen
            jobs = list(dict.fromkeys(job for ids in (*pass_.jobs.values(),
                                                      *pass_.instance_jobs.values())
                                      for job in ids))
            attributes = ({} if self.attributes is None
                          else self.attributes(jobs, pass_.skipped))
            _accumulate(self._skipped, pass_.skipped)
            _accumulate(self._dropped, pass_.dropped)
            skipped = MappingProxyType(dict(self._skipped))
            dropped = MappingProxyType(dict(self._dropped))
        return JobsReading(jobs=MappingProxyType(dict(sorted(pass_.jobs.items()))),
                           skipped_total=skipped, dropped_total=dropped,
                           instance_jobs=MappingProxyType(dict(sorted(
                               pass_.instance_jobs.items()))),
                           attributes=MappingProxyType(attributes))

    def _names(self, pass_: _Pass) -> tuple[list[_Name], bool]:
        """(GPU, instance) named in the directory, lowest GPU first (its whole-GPU file
        before its instances'), and whether the listing was complete; bad names are
        counted. Raises OSError unless it is a directory or absent."""
        indices: list[_Name] = []
        try:
            with os.scandir(self.directory) as entries:
                for count, entry in enumerate(entries):
                    if count >= MAX_ENTRIES:
                        pass_.skip("too_many_files")
                        return sorted(indices, key=_order), False
                    if entry.name.startswith("."):
                        continue
                    try:
                        indices.append(parse_mapping_name(entry.name, self.gpu_count))
                    except BadFile as exc:
                        pass_.skip(exc.reason)
        except FileNotFoundError:
            return [], True  # not there (yet): no jobs
        except NotADirectoryError:
            raise NotADirectoryError(f"{self.directory}: the job mapping path is not a "
                                     "directory") from None
        return sorted(indices, key=_order), True

    def _file(self, name: str, seen: dict[str, tuple[_Key, tuple[str, ...] | str]],
              listed: bool = True) -> tuple[str, ...] | str:
        """The file's job ids, or the reason it was skipped (cached while unchanged); ()
        for a file looked up by name (not listed) that is not there."""
        result = read_cached(os.path.join(self.directory, name), name, self._cache, seen,
                             parse_job_file, "vanished" if listed else ())
        assert result is not None  # for mypy: `missing` is never None here
        return result
