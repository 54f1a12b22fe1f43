"""InfiniBand / RoCE ports from sysfs (``<root>/class/infiniband``).

Reading and parsing are kept apart: the ``parse_*`` functions are pure (bytes in,
values out, :class:`BadValue` with a reason for anything unusable); the
:class:`InfinibandCollector` walks the tree, reads every file with one bounded
``os.read`` and hands the bytes to the parsers.

One bad file (``N/A (no PMA)``, empty, garbage, negative, past 2^64-1, or a read
that fails with EINVAL/EACCES/EOPNOTSUPP/...) is skipped alone and counted by
reason; the rest of the port and device is still returned. A node without
``class/infiniband`` simply has no devices.
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

__all__ = [
    "DATA_COUNTERS",
    "MAX_READ_BYTES",
    "SKIP_REASONS",
    "BadValue",
    "InfinibandDevice",
    "InfinibandPort",
    "InfinibandReading",
    "InfinibandCollector",
    "parse_counter",
    "parse_rate",
    "parse_state",
    "parse_text",
]

#: Cap on one ``read()`` of a sysfs attribute (sysfs serves at most a page).
MAX_READ_BYTES = 4096

#: Largest value a counter may hold (64-bit unsigned).
U64_MAX = 2**64 - 1

#: Counters that count 4-octet words (in ``counters/`` and ``counters_ext/``).
DATA_COUNTERS = frozenset(
    {"port_xmit_data", "port_rcv_data", "port_xmit_data_64", "port_rcv_data_64"}
)

#: ``hw_counters/lifespan``: milliseconds, exported as seconds (not a counter).
LIFESPAN = "lifespan"

#: Every reason a value can be skipped for (the self-metric's ``reason`` label).
SKIP_REASONS = (
    "not_available",  # the driver says "N/A (no PMA)" or similar
    "empty",  # nothing but whitespace
    "garbage",  # not a number / not the expected format
    "negative",  # a negative number where a counter was expected
    "overflow",  # a number past 2^64-1
    "read_error",  # the read failed (EINVAL, EACCES, EOPNOTSUPP, EISDIR, EIO, ...)
    "vanished",  # listed, then gone before it could be read (ENOENT)
    "bad_name",  # a port directory or counter file whose name we cannot use
    "not_a_directory",  # a file (or other non-directory) where a device or port should be
    "not_a_file",  # a FIFO, socket or device where an attribute file should be
)

_NAME_RE = re.compile(r"[A-Za-z0-9_]+\Z")
_DEVICE_RE = re.compile(r"[A-Za-z0-9_.:-]+\Z")
_UINT_RE = re.compile(rb"[0-9]+\Z")
_NEG_RE = re.compile(rb"-[0-9]+\Z")
_STATE_RE = re.compile(rb"([0-9]+):\s*(\S.*?)\Z")
_RATE_RE = re.compile(rb"([0-9]+(?:\.[0-9]+)?) Gb/sec(?: \(.*\))?\Z")
_GBIT_IN_BYTES = 125_000_000  # 1 Gb/s in bytes/s

T = TypeVar("T")


class BadValue(ValueError):
    """A sysfs value that cannot be used; ``reason`` is one of :data:`SKIP_REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


# ---------------------------------------------------------------- pure parsing


def parse_counter(raw: bytes) -> int:
    """Parse a counter file's content into an unsigned 64-bit integer."""
    text = raw.strip()
    if text.isdigit():  # the common case (ASCII digits only)
        value = int(text)
        if value > U64_MAX:
            raise BadValue("overflow")
        return value
    if not text:
        raise BadValue("empty")
    if text.startswith(b"N/A"):
        raise BadValue("not_available", text[:40].decode("ascii", "replace"))
    if _UINT_RE.match(text) is None:
        if _NEG_RE.match(text) is not None:
            raise BadValue("negative")
        raise BadValue("garbage", repr(text[:40]))
    value = int(text)
    if value > U64_MAX:
        raise BadValue("overflow")
    return value


def parse_state(raw: bytes) -> tuple[int, str]:
    """Parse ``state`` / ``phys_state`` content such as ``4: ACTIVE`` into (id, name)."""
    text = raw.strip()
    if not text:
        raise BadValue("empty")
    match = _STATE_RE.match(text)
    if match is None:
        raise BadValue("garbage", repr(text[:40]))
    name = _decode(match.group(2))
    return int(match.group(1)), name


def parse_rate(raw: bytes) -> float:
    """Parse ``rate`` content such as ``400 Gb/sec (4X NDR)`` into bytes per second."""
    text = raw.strip()
    if not text:
        raise BadValue("empty")
    match = _RATE_RE.match(text)
    if match is None:
        raise BadValue("garbage", repr(text[:40]))
    return float(match.group(1)) * _GBIT_IN_BYTES


def parse_text(raw: bytes) -> str:
    """Parse a one-line identity attribute (``fw_ver``, ``board_id``, ...)."""
    return _decode(raw.strip())


def _decode(raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadValue("garbage", "not UTF-8") from exc
    if not text.isprintable():
        raise BadValue("garbage", "unprintable characters")
    return text


def scale_counter(name: str, value: int) -> float:
    """Scale a raw counter to base units: data counters count 4-octet words."""
    return float(value * 4) if name in DATA_COUNTERS else float(value)


# ---------------------------------------------------------------- values


@dataclass(frozen=True)
class InfinibandPort:
    """One port of one HCA. ``None`` means the attribute was absent or unusable."""

    device: str
    port: int
    link_layer: str | None = None
    state_id: int | None = None
    state: str | None = None
    phys_state_id: int | None = None
    phys_state: str | None = None
    rate_bytes_per_second: float | None = None
    #: ``counters/<name>`` by file name; data counters already in bytes.
    counters: Mapping[str, float] = field(default_factory=dict)
    #: ``counters_ext/<name>`` by file name; data counters already in bytes.
    counters_ext: Mapping[str, float] = field(default_factory=dict)
    #: ``hw_counters/<name>`` by file name, without ``lifespan``.
    hw_counters: Mapping[str, float] = field(default_factory=dict)
    #: ``hw_counters/lifespan`` converted from milliseconds.
    lifespan_seconds: float | None = None


@dataclass(frozen=True)
class InfinibandDevice:
    """One HCA. Identity strings are ``""`` when the driver does not offer them."""

    name: str
    board_id: str = ""
    fw_ver: str = ""
    hca_type: str = ""
    node_guid: str = ""
    ports: tuple[InfinibandPort, ...] = ()


@dataclass(frozen=True)
class InfinibandReading:
    devices: tuple[InfinibandDevice, ...]
    #: Cumulative count of skipped files by reason since the source was created.
    skipped_total: Mapping[str, int]


# ---------------------------------------------------------------- reading


class _Walk:
    """State of one read: the skip tally of this pass."""

    __slots__ = ("skipped",)

    def __init__(self) -> None:
        self.skipped: dict[str, int] = {}

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def _read_bounded(path: str, dir_fd: int | None = None) -> bytes:
    """One bounded ``read()`` of a sysfs attribute (``path`` relative to ``dir_fd`` if set).

    Opened non-blocking and checked to be a regular file first: a FIFO (or a device)
    where an attribute should be would otherwise block the open, and with it every
    other counter of the read."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadValue("not_a_file")
        return os.read(fd, MAX_READ_BYTES)
    finally:
        os.close(fd)


def _list_dir(path: str) -> list[str] | None:
    """Names in a directory, sorted; ``None`` if it is not there."""
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return None


def _is_dir(walk: _Walk, path: str) -> bool:
    """Whether a listed entry is a directory (sysfs devices are links to one); a skip
    with its reason if not."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        walk.skip("vanished")
        return False
    except OSError:
        walk.skip("read_error")
        return False
    if not stat.S_ISDIR(mode):
        walk.skip("not_a_directory")
        return False
    return True


class InfinibandCollector:
    """Reads every InfiniBand/RoCE device under ``<sysfs_root>/class/infiniband``."""

    name = "infiniband"

    def __init__(self, sysfs_root: str | os.PathLike[str] = "/sys") -> None:
        self._class_dir = os.path.join(os.fspath(sysfs_root), "class", "infiniband")
        self._lock = threading.Lock()
        self._skipped: dict[str, int] = dict.fromkeys(SKIP_REASONS, 0)

    @property
    def class_dir(self) -> str:
        return self._class_dir

    def read(self) -> InfinibandReading:
        walk = _Walk()
        devices: list[InfinibandDevice] = []
        for name in self._names(walk, self._class_dir):
            if _DEVICE_RE.match(name) is None:
                walk.skip("bad_name")
                continue
            if not _is_dir(walk, os.path.join(self._class_dir, name)):
                continue
            device = self._read_device(walk, name)
            if device is not None:
                devices.append(device)
        with self._lock:
            for reason, count in walk.skipped.items():
                self._skipped[reason] = self._skipped.get(reason, 0) + count
            skipped = MappingProxyType(dict(self._skipped))
        return InfinibandReading(devices=tuple(devices), skipped_total=skipped)

    @staticmethod
    def _names(walk: _Walk, directory: str) -> list[str]:
        """Sorted names in ``directory``: none if it is absent or cannot be listed."""
        try:
            return _list_dir(directory) or []
        except OSError:
            walk.skip("read_error")
            return []

    # -- one device

    def _read_device(self, walk: _Walk, name: str) -> InfinibandDevice | None:
        base = os.path.join(self._class_dir, name)
        ident = {
            attr: self._attr(walk, os.path.join(base, attr), parse_text) or ""
            for attr in ("board_id", "fw_ver", "hca_type", "node_guid")
        }
        ports_dir = os.path.join(base, "ports")
        ports: list[InfinibandPort] = []
        for port_name in self._names(walk, ports_dir):
            if not port_name.isdigit() or not port_name.isascii():
                walk.skip("bad_name")
                continue
            if not _is_dir(walk, os.path.join(ports_dir, port_name)):
                continue  # a file named like a port is not a port
            ports.append(
                self._read_port(walk, name, int(port_name), os.path.join(ports_dir, port_name))
            )
        ports.sort(key=lambda p: p.port)
        if not ports and not os.path.isdir(base):  # unplugged while we read it
            walk.skip("vanished")
            return None
        return InfinibandDevice(name=name, ports=tuple(ports), **ident)

    # -- one port

    def _read_port(self, walk: _Walk, device: str, port: int, base: str) -> InfinibandPort:
        state = self._attr(walk, os.path.join(base, "state"), parse_state)
        phys = self._attr(walk, os.path.join(base, "phys_state"), parse_state)
        hw = self._counters(walk, os.path.join(base, "hw_counters"))
        lifespan_ms = hw.pop(LIFESPAN, None)
        return InfinibandPort(
            device=device,
            port=port,
            link_layer=self._attr(walk, os.path.join(base, "link_layer"), parse_text),
            state_id=state[0] if state else None,
            state=state[1] if state else None,
            phys_state_id=phys[0] if phys else None,
            phys_state=phys[1] if phys else None,
            rate_bytes_per_second=self._attr(walk, os.path.join(base, "rate"), parse_rate),
            counters=MappingProxyType(self._counters(walk, os.path.join(base, "counters"))),
            counters_ext=MappingProxyType(self._counters(walk, os.path.join(base, "counters_ext"))),
            hw_counters=MappingProxyType(hw),
            lifespan_seconds=None if lifespan_ms is None else lifespan_ms / 1000.0,
        )

    def _counters(self, walk: _Walk, directory: str) -> dict[str, float]:
        values: dict[str, float] = {}
        names = self._names(walk, directory)
        if not names:
            return values
        try:  # open the files relative to the directory: no path walk per file
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            walk.skip("vanished")
            return values
        try:
            for name in names:
                if _NAME_RE.match(name) is None:
                    walk.skip("bad_name")
                    continue
                try:
                    raw = _read_bounded(name, dir_fd)
                    value = parse_counter(raw)
                except BadValue as exc:
                    walk.skip(exc.reason)
                except FileNotFoundError:
                    walk.skip("vanished")
                except OSError:
                    walk.skip("read_error")
                else:
                    values[name] = scale_counter(name, value)
        finally:
            os.close(dir_fd)
        return values

    @staticmethod
    def _attr(walk: _Walk, path: str, parse: Callable[[bytes], T]) -> T | None:
        """Read and parse a fixed-name attribute; ``None`` if absent or unusable."""
        try:
            raw = _read_bounded(path)
        except FileNotFoundError:
            return None  # the driver does not offer it: not a skip
        except BadValue as exc:
            walk.skip(exc.reason)
            return None
        except OSError as exc:
            if exc.errno == errno.ENOTDIR:
                return None
            walk.skip("read_error")
            return None
        try:
            return parse(raw)
        except BadValue as exc:
            walk.skip(exc.reason)
            return None
