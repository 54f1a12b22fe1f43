"""Traces: per-GPU time series read from a file, and the writer of our own format.

Two formats are read (exporter.traces.load), sniffed from the first non-blank line:

- ``nvidia-smi``: the CSV that ``nvidia-smi --query-gpu=... --format=csv`` prints
  (read by exporter.traces.nvsmi);
- ``cte``: the exporter's own recording (see ``docs/trace-format.md``), written by
  :class:`TraceWriter`, read by exporter.traces.cte.

Either may be gzip-compressed (told by its magic bytes); other binary data is refused
without quoting it. Both are read a block at a time (exporter.traces.reading).

Fatal problems raise :class:`TraceError` with a message ``FILE:LINE: message``.
Malformed data lines are skipped: their count is ``Trace.skipped_lines``, the first
1000 line numbers (with the reason) are in ``Trace.skipped`` and every reason's count in
``Trace.skip_reasons``.  Implausible values (not
finite, outside what a GPU can report; exporter.traces.checks) are dropped and
counted in ``Trace.rejected``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO

import numpy as np

from exporter.traces.checks import gpu_index_problem

CANONICAL_FIELDS: tuple[str, ...] = (
    "power_watts",
    "power_average_watts",
    "energy_joules",
    "temperature_celsius",
    "memory_temperature_celsius",
    "utilization_gpu_ratio",
    "utilization_memory_ratio",
    "sm_clock_hertz",
    "memory_clock_hertz",
    "power_limit_watts",
    "memory_used_bytes",
    "clock_event_reasons",
)

CTE_MAGIC = "# cte-trace v1"


class TraceError(ValueError):
    """A trace that cannot be read; the message reads ``FILE:LINE: message``."""


class BadLine(Exception):
    """A malformed data line: skipped and counted, the message says why."""


@dataclass
class GpuSeries:
    gpu: int
    t: np.ndarray  # float64 seconds since the Unix epoch, increasing
    fields: Mapping[str, np.ndarray]  # canonical field name -> float64, NaN where missing


class PackedFields(Mapping[str, np.ndarray]):
    """A GPU's fields, those whose every value is a float32 times a factor (the file's
    unit: whole degrees, percent, MHz) kept so, in half the memory (as uint8 or uint16,
    an eighth or a quarter, where they are whole numbers that fit); a packed field whose
    every value is the same (a power limit) is kept as that one value. Each read gives
    the float64 values in base units, the same numbers the file's text gave (the reader
    packs a value only when unpacking gives it back exactly): a new array each time."""

    def __init__(self, arrays: Mapping[str, np.ndarray], factors: Mapping[str, float]
                 ) -> None:
        self._arrays = {name: constant_view(a) for name, a in arrays.items()}
        self._factors = dict(factors)  # field -> factor, for the packed ones

    def __getitem__(self, name: str) -> np.ndarray:
        a = self._arrays[name]
        if a.dtype == np.float64:
            return a
        return unpack(a, self._factors[name])

    def part(self, name: str, start: int, stop: int) -> np.ndarray:
        """Values ``start:stop`` of one field, as ``self[name][start:stop]`` gives them,
        unpacking only those."""
        a = self._arrays[name][start:stop]
        if a.dtype == np.float64:
            return a
        return unpack(a, self._factors[name])

    def __contains__(self, name: object) -> bool:
        return name in self._arrays  # without unpacking it (Mapping's would)

    def finite(self, name: str) -> np.ndarray:
        """np.isfinite(self[name]), from the kept values (a packed value times a factor
        is finite where the packed value is)."""
        return np.isfinite(self._arrays[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def nbytes(self) -> int:
        """The memory the values take."""
        return sum(a.itemsize if a.strides == (0,) else a.nbytes
                   for a in self._arrays.values())


def unpack(a: np.ndarray, factor: float) -> np.ndarray:
    """Packed values (float32, uint8, uint16) in the file's unit -> float64 in base units
    (one rounding, always the same: the reader checked that it gives each value back)."""
    out = a.astype(np.float64)
    if factor != 1.0:
        out *= factor
    return out


def constant_view(a: np.ndarray) -> np.ndarray:
    """A packed field whose every value is the same (a power limit) as a read-only view of
    one value: each read unpacks it to a whole array anyway."""
    if a.dtype == np.float64 or a.ndim != 1 or a.size < 2 or a.strides == (0,):
        return a
    first = a[:1]
    if not (np.isfinite(first[0]) and bool((a == first[0]).all())):
        return a
    return np.broadcast_to(first.copy(), a.shape)


@dataclass
class Trace:
    source: str
    format: str  # "nvidia-smi" or "cte"
    gpus: list[int]
    series: dict[int, GpuSeries]
    skipped_lines: int
    tdp_watts: dict[int, float]
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line number, reason)
    # Which column gave power_watts: "power.draw.instant", "power.draw" (a ~1 s
    # average on Ampere and newer except GA100, instantaneous on older boards),
    # "power.draw.average" or, for cte traces, "power_watts".
    power_column: str = "power_watts"
    # What the file itself states about the power sensor's averaging:
    # power_averaging_stated is True for power.draw.instant (seconds None),
    # power.draw.average (1.0) and a cte header's power_averaging_seconds
    # (null: instantaneous); False for plain power.draw, which depends on the
    # GPU (exporter.offline.band decides).
    power_averaging_seconds: float | None = None
    power_averaging_stated: bool = False
    gpu_names: dict[int, str] = field(default_factory=dict)  # "NVIDIA H100 80GB HBM3", ...
    rejected: dict[str, int] = field(default_factory=dict)  # implausible values by reason
    meta: dict[str, object] = field(default_factory=dict)  # the cte header, as read
    # skipped lines by reason, all of them (``skipped`` keeps the first 1000 only)
    skip_reasons: Counter[str] = field(default_factory=Counter)
    # rows of a GPU with the time of another row of that GPU, merged into it (later
    # values win), and rows earlier than a row of their GPU read before them (sorted)
    collapsed_rows: int = 0
    out_of_order_rows: int = 0


# --------------------------------------------------------------------------- usable power


def power_gpus(trace: Trace) -> tuple[list[int], list[str]]:
    """The GPUs with at least two power readings, and a note for each one left out.

    `analyze` and `run --replay` both start from this: a trace in which no GPU has two
    plausible power readings (all missing, all implausible, one timestamp) raises
    TraceError, so neither analyses nor serves a power figure the trace does not hold.
    """
    usable: list[int] = []
    notes: list[str] = []
    for g in trace.gpus:
        if np.isfinite(trace.series[g].fields["power_watts"]).sum() >= 2:
            usable.append(g)
        else:
            notes.append(f"GPU {g} has no power readings and is left out")
    if not usable:
        raise TraceError(f"{trace.source}: no GPU has at least two power readings")
    return usable, notes


# --------------------------------------------------------------------------- rows


def gpu_index(text: str) -> int:
    """A GPU index cell, or BadLine."""
    try:
        gpu = int(text)  # int() itself ignores surrounding whitespace
    except ValueError:
        raise BadLine(f"unparsable index {text.strip()!r}") from None
    why = gpu_index_problem(gpu)
    if why:
        raise BadLine(why)
    return gpu


# --------------------------------------------------------------------------- writing


def _fmt(v: float) -> str:
    return "" if v is None or math.isnan(v) else repr(float(v))


class TraceWriter:
    """Append-only writer of the cte trace format (see docs/trace-format.md).

    Rows may carry only some fields (power at ~20 Hz, the rest at ~1 Hz): the
    others are left empty.  With ``append=True`` an existing file with the same
    columns is extended; a fresh file gets the header.  With ``exclusive=True`` an
    existing file is never replaced (FileExistsError).
    """

    def __init__(self, path: str | os.PathLike[str], gpus: Iterable[int],
                 tdp_watts: Mapping[int, float] | None, fields: Iterable[str], *,
                 host: str | None = None, started_at: float | None = None,
                 append: bool = False, power_averaging_seconds: float | None = None,
                 gpu_names: Mapping[int, str] | None = None, exclusive: bool = False) -> None:
        self.path = os.fspath(path)
        self.gpus = sorted(int(g) for g in gpus)
        self.fields = list(fields)
        bad = [f for f in self.fields if not re.fullmatch(r"[a-z][a-z0-9_]*", f)]
        if bad or len(set(self.fields)) != len(self.fields) or not self.fields:
            raise ValueError(f"bad field names {self.fields!r}")
        self._index = {f: i for i, f in enumerate(self.fields)}
        self._gpuset = set(self.gpus)
        exists = append and os.path.exists(self.path) and os.path.getsize(self.path) > 0
        if exists:
            with open(self.path, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
            cols = next((ln for ln in lines[1:] if ln and not ln.startswith("#")), "")
            if not lines[0].startswith(CTE_MAGIC) or cols != ",".join(["t", "gpu", *self.fields]):
                raise ValueError(f"{self.path}: cannot append: not a cte trace with these fields")
            self._fh: IO[str] = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            return
        meta: dict[str, object] = {
            "gpus": self.gpus,
            "tdp_watts": {str(k): float(v) for k, v in (tdp_watts or {}).items()},
            "fields": self.fields,
            "started_at": started_at,
            "host": host,
            "power_averaging_seconds": power_averaging_seconds,
        }
        if gpu_names:  # optional: tells a reader the GPU generation (how it reports power)
            meta["gpu_names"] = {str(k): str(v) for k, v in gpu_names.items()}
        # exclusive: FileExistsError rather than replace a file that exists
        self._fh = open(self.path, "x" if exclusive else "w", encoding="utf-8")  # noqa: SIM115
        self._fh.write(f"{CTE_MAGIC} {json.dumps(meta, separators=(',', ':'))}\n")
        self._fh.write(",".join(["t", "gpu", *self.fields]) + "\n")

    def write(self, t: float, gpu: int, values: Mapping[str, float]) -> None:
        if gpu not in self._gpuset:
            raise ValueError(f"GPU {gpu} is not in this trace's GPUs {self.gpus}")
        cells = [""] * len(self.fields)
        for name, v in values.items():
            i = self._index.get(name)
            if i is None:
                raise ValueError(f"field {name!r} is not in this trace's fields")
            cells[i] = _fmt(v)
        self._fh.write(f"{t:.6f},{gpu},{','.join(cells)}\n")

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def abandon(self) -> None:
        """After a failed write (disk full, file size limit): close without raising and
        cut a regular file back to its last whole line, so it reads to its last whole row."""
        with contextlib.suppress(OSError):
            self._fh.close()  # flushes what fits; the rest is lost either way
        _cut_to_last_line(self.path)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cut_to_last_line(path: str) -> None:
    """Truncate a regular file after its last newline (a partial last line is dropped)."""
    if not os.path.isfile(path):  # /dev/full, a pipe: nothing to cut
        return
    try:
        with open(path, "rb+") as fh:
            end = fh.seek(0, os.SEEK_END)
            start = max(0, end - (1 << 20))  # rows are short: the last newline is near
            fh.seek(start)
            tail = fh.read()
            cut = tail.rfind(b"\n")
            fh.truncate(start + cut + 1 if cut >= 0 else start)
    except OSError:
        pass  # nothing more can be done: the reader skips a partial last line
