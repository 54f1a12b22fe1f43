"""Reading files the daemon is given by name (config, web config, TLS files, scenarios,
traces) only when they are regular files.

A named pipe (FIFO) given as a config file blocks open() until something writes to it,
which may be never: `check-config` hangs, a start hangs, and a SIGHUP reload hangs and
holds back every later reload. A device or socket is no file to read settings from
either. So the path is checked before it is opened, and opened without blocking with the
check repeated on the open descriptor, so a file swapped for a FIFO in between cannot
hang the read either. Errors are OSError whose strerror says what the path is.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotRegularFile(OSError):
    """The path names something other than a regular file; strerror says what."""


def _refuse_special(mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise NotRegularFile(0, f"{kind}, not a regular file")


def check_regular(path: str | os.PathLike[str]) -> None:
    """Raise OSError unless path (symbolic links followed) is a regular file; for files
    handed to a library that opens them itself (OpenSSL)."""
    _refuse_special(os.stat(path).st_mode)


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """A regular file opened for reading in binary (for files read a block at a time);
    OSError for anything else, at once."""
    check_regular(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _refuse_special(os.fstat(fd).st_mode)  # the path may have changed since the stat
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of a regular file (at most limit + 1 of them when limit is given, so a
    caller can tell 'larger than limit'); OSError for anything else, at once."""
    with open_regular(path) as file:
        return file.read() if limit is None else file.read(limit + 1)
