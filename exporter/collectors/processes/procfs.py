"""A GPU process's command name and container id, from ``<procfs>/PID/comm`` and
``<procfs>/PID/cgroup``, and its distributed rank, from ``<procfs>/PID/environ``.

Read once per process (when it first shows on a GPU), each file with bounded reads,
without blocking or following links: three files per new process, nothing per process
already known (a process's environ is what it was started with; it does not change).
Parsing is pure (:func:`parse_comm`, :func:`container_id`, :func:`parse_ranks`).

The environment needs more than the other two files: the kernel lets only the process's
own user, or a holder of ``CAP_SYS_PTRACE``, read it. Where it is refused the ranks stay
unknown, the refusal is counted (``environ_denied``) and logged once; command and
container are still served. Of the environment only the rank variables are kept.

The PIDs NVML reports are the host's: the labels are right only where this process sees
the host's PID namespace (on the host, or a pod with ``hostPID: true``); elsewhere a PID
names nothing, or another process, so :class:`ProcReader` is given the root to use
(``--path.procfs``) and is off on a fake node, whose PIDs are made up.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from dataclasses import dataclass

__all__ = ["LOCAL_RANK_NAMES", "MAX_ENVIRON_BYTES", "MAX_READ_BYTES", "PROC_ERRORS",
           "RANK_NAMES", "ProcLabels", "ProcReader", "container_id", "parse_comm",
           "parse_ranks"]

log = logging.getLogger(__name__)

#: Bytes read of one file at most (comm is 16; a cgroup file a line per hierarchy).
MAX_READ_BYTES = 4096
#: Bytes read of a process's environ at most; a variable cut at the bound is dropped.
MAX_ENVIRON_BYTES = 256 * 1024
#: Why a process's labels, or its ranks, could not be read (the self-metric's ``reason``).
PROC_ERRORS = ("vanished", "read_error", "environ_denied")

#: Where a launcher puts the global rank, first one with a valid value wins: torchrun
#: (and anything that follows torch.distributed's names), Open MPI, MPICH/Intel MPI
#: (PMI), Slurm's srun. RANK comes first: under `srun torchrun`, SLURM_PROCID is the
#: launcher's, which every worker inherits, while RANK is the worker's own.
RANK_NAMES = (b"RANK", b"OMPI_COMM_WORLD_RANK", b"PMI_RANK", b"SLURM_PROCID")
#: The rank on this node, in the same order.
LOCAL_RANK_NAMES = (b"LOCAL_RANK", b"OMPI_COMM_WORLD_LOCAL_RANK", b"SLURM_LOCALID")

# A rank as served: a non-negative decimal integer (9 digits: under a billion processes).
_RANK_RE = re.compile(rb"[0-9]{1,9}")

# A container id in a cgroup path: 64 hex digits, as docker, containerd and CRI-O name
# them (`docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`, `/docker/<id>`).
_CONTAINER_RE = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")


@dataclass(frozen=True)
class ProcLabels:
    command: str = ""
    container_id: str = ""
    rank: int | None = None  # global rank, from the environment; None: unknown
    local_rank: int | None = None


def parse_comm(raw: bytes) -> str:
    """The command name (at most 15 characters, as the kernel keeps it), unprintable
    characters replaced by ``?``."""
    text = raw.split(b"\n", 1)[0][:15].decode("utf-8", "replace")
    return "".join(c if c.isprintable() else "?" for c in text)


def container_id(raw: bytes) -> str:
    """The container id in a ``/proc/PID/cgroup`` file, or "" (not in a container).
    The last id on a line is the innermost (a container in a pod's cgroup)."""
    text = raw.decode("ascii", "replace")
    for line in text.splitlines():
        found = _CONTAINER_RE.findall(line.rpartition(":")[2])
        if found:
            return found[-1]
    return ""


def _environ_variables(raw: bytes, complete: bool) -> dict[bytes, bytes]:
    """NAME -> value of a NUL-separated environ; the first of a name wins (as getenv).
    Not `complete` (cut at the read's bound): the last, maybe partial, entry is dropped."""
    entries = raw.split(b"\0")
    if not complete:
        entries = entries[:-1]
    out: dict[bytes, bytes] = {}
    for entry in entries:
        name, eq, value = entry.partition(b"=")
        if eq and name not in out:
            out[name] = value
    return out


def _first_rank(variables: dict[bytes, bytes], names: tuple[bytes, ...]) -> int | None:
    for name in names:
        value = variables.get(name)
        if value is not None and _RANK_RE.fullmatch(value):
            return int(value)
    return None


def parse_ranks(raw: bytes, complete: bool = True) -> tuple[int | None, int | None]:
    """(global rank, local rank) from a ``/proc/PID/environ``: for each, the first of
    :data:`RANK_NAMES` (:data:`LOCAL_RANK_NAMES`) that holds a non-negative integer; a
    value that is not one (empty, negative, a word, too long) counts as absent."""
    variables = _environ_variables(raw, complete)
    return _first_rank(variables, RANK_NAMES), _first_rank(variables, LOCAL_RANK_NAMES)


def _read_bounded(path: str, limit: int = MAX_READ_BYTES) -> bytes:
    """At most `limit` bytes of `path`, read until its end (procfs may answer a page a
    read)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | os.O_NOFOLLOW
    fd = os.open(path, flags)
    try:
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, limit - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class ProcReader:
    """Reads labels under `root`; counts what it could not read, by reason."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.errors: dict[str, int] = dict.fromkeys(PROC_ERRORS, 0)
        self._denied_said = False

    def labels(self, pid: int) -> ProcLabels | None:
        """The process's labels; None (counted) when its entry is gone or unreadable.
        An environment that may not be read leaves only the ranks unknown (counted)."""
        base = os.path.join(self.root, str(pid))
        try:
            command = parse_comm(_read_bounded(os.path.join(base, "comm")))
            cgroup = container_id(_read_bounded(os.path.join(base, "cgroup")))
            rank, local_rank = self._ranks(pid, os.path.join(base, "environ"))
        except FileNotFoundError:
            self.errors["vanished"] += 1
            return None
        except OSError as exc:
            reason = "vanished" if exc.errno in (errno.ESRCH, errno.ENOTDIR) else "read_error"
            self.errors[reason] += 1
            return None
        return ProcLabels(command, cgroup, rank, local_rank)

    def _ranks(self, pid: int, path: str) -> tuple[int | None, int | None]:
        try:
            raw = _read_bounded(path, MAX_ENVIRON_BYTES)
        except PermissionError as exc:  # another user's process, without CAP_SYS_PTRACE
            self.errors["environ_denied"] += 1
            if not self._denied_said:
                self._denied_said = True
                log.info("processes: the rank and local_rank of gpu_process_info are not "
                         "read where a process's environment is refused (%s, pid %d): "
                         "reading it needs the process's user or CAP_SYS_PTRACE; counted "
                         "in cte_gpu_process_proc_errors_total{reason=\"environ_denied\"}",
                         exc.strerror, pid)
            return None, None
        return parse_ranks(raw, complete=len(raw) < MAX_ENVIRON_BYTES)
