"""A GPU process's command name and container id, from ``<procfs>/PID/comm`` and
``<procfs>/PID/cgroup``.

Read once per process (when it first shows on a GPU), with one bounded ``read()`` each,
without blocking or following links: two small files per new process, nothing per
process already known. Parsing is pure (:func:`parse_comm`, :func:`container_id`).

The PIDs NVML reports are the host's: the labels are right only where this process sees
the host's PID namespace (on the host, or a pod with ``hostPID: true``); elsewhere a PID
names nothing, or another process, so :class:`ProcReader` is given the root to use
(``--path.procfs``) and is off on a fake node, whose PIDs are made up.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

__all__ = ["MAX_READ_BYTES", "PROC_ERRORS", "ProcLabels", "ProcReader", "container_id",
           "parse_comm"]

#: Bytes read of one file at most (comm is 16; a cgroup file a line per hierarchy).
MAX_READ_BYTES = 4096
#: Why a process's labels could not be read (the self-metric's ``reason`` label).
PROC_ERRORS = ("vanished", "read_error")

# A container id in a cgroup path: 64 hex digits, as docker, containerd and CRI-O name
# them (`docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`, `/docker/<id>`).
_CONTAINER_RE = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")


@dataclass(frozen=True)
class ProcLabels:
    command: str = ""
    container_id: str = ""


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


def _read_bounded(path: str) -> bytes:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | os.O_NOFOLLOW
    fd = os.open(path, flags)
    try:
        return os.read(fd, MAX_READ_BYTES)
    finally:
        os.close(fd)


class ProcReader:
    """Reads labels under `root`; counts what it could not read, by reason."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.errors: dict[str, int] = dict.fromkeys(PROC_ERRORS, 0)

    def labels(self, pid: int) -> ProcLabels | None:
        """The process's labels; None (counted) when its entry is gone or unreadable."""
        base = os.path.join(self.root, str(pid))
        try:
            command = parse_comm(_read_bounded(os.path.join(base, "comm")))
            cgroup = container_id(_read_bounded(os.path.join(base, "cgroup")))
        except FileNotFoundError:
            self.errors["vanished"] += 1
            return None
        except OSError as exc:
            reason = "vanished" if exc.errno in (errno.ESRCH, errno.ENOTDIR) else "read_error"
            self.errors[reason] += 1
            return None
        return ProcLabels(command, cgroup)
