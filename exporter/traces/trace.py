"""Traces: per-GPU time series read from a file, and the writer of our own format.

Two formats are read, sniffed from the first non-blank line:

- ``nvidia-smi``: the CSV that ``nvidia-smi --query-gpu=... --format=csv`` prints
  (read by exporter.traces.nvsmi);
- ``cte``: the exporter's own recording (see ``docs/trace-format.md``), written by
  :class:`TraceWriter`.

Either may be gzip-compressed (told by its magic bytes); other binary data is refused
without quoting it.

Fatal problems raise :class:`TraceError` with a message ``FILE:LINE: message``.
Malformed data lines are skipped: their count is ``Trace.skipped_lines`` and their
line numbers (with the reason) are in ``Trace.skipped``.  Implausible values (not
finite, outside what a GPU can report; exporter.traces.checks) are dropped and
counted in ``Trace.rejected``.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import re
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO

import numpy as np

from exporter.jsontext import loads
from exporter.regularfile import read_regular
from exporter.traces.checks import gpu_index_problem, screen, time_bounds

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
    fields: dict[str, np.ndarray]  # canonical field name -> float64, NaN where missing


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


# --------------------------------------------------------------------------- reading


GZIP_MAGIC = b"\x1f\x8b"
MAX_GUNZIPPED_BYTES = 2 << 30  # ~30 hours of 8 GPUs at the driver's rate; a bomb stops here
# compressed formats read only once decompressed (magic bytes -> name)
_COMPRESSED = ((b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
               (b"\x04\x22\x4d\x18", "lz4"), (b"PK\x03\x04", "zip"))
_BOMS_UTF16 = (b"\xff\xfe", b"\xfe\xff")  # nvidia-smi > file in Windows PowerShell writes UTF-16
_CONTROL = bytes(c for c in range(32) if chr(c) not in "\t\n\r\f\v") + b"\x7f"
_SNIFF_BYTES = 1 << 16


def read_lines(path: str) -> list[str]:
    """The file's lines: plain text or gzip (sniffed by their magic bytes, not by the
    name); other compressed or binary data is refused in one line that quotes none of it."""
    try:
        raw = read_regular(path)  # a FIFO or device is refused, not waited on
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if raw.startswith(GZIP_MAGIC):
        raw = _gunzip(path, raw)
    return _text(path, raw).splitlines()


def _gunzip(path: str, raw: bytes) -> bytes:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as fh:
            data = fh.read(MAX_GUNZIPPED_BYTES + 1)
    except EOFError:
        raise TraceError(f"{path}: gzip data cut short (an incomplete copy?): cannot read "
                         "it to its end") from None
    except (OSError, zlib.error):  # gzip.BadGzipFile is an OSError
        raise TraceError(f"{path}: damaged gzip data: cannot decompress it") from None
    if len(data) > MAX_GUNZIPPED_BYTES:
        raise TraceError(f"{path}: more than {MAX_GUNZIPPED_BYTES >> 30} GiB once "
                         "decompressed: cut the trace")
    return data


def _text(path: str, data: bytes) -> str:
    if data.startswith(_BOMS_UTF16):
        return data.decode("utf-16", errors="replace")
    packed = next((name for magic, name in _COMPRESSED if data.startswith(magic)), None)
    if packed:
        raise TraceError(f"{path}: {packed}-compressed: decompress it first (gzip is read "
                         "as it is)")
    if _binary(data[:_SNIFF_BYTES]):
        raise TraceError(f"{path}: binary data, not a trace: expected a cte trace or an "
                         "nvidia-smi CSV log, as text or gzip-compressed")
    return data.decode("utf-8-sig", errors="replace")


def _binary(head: bytes) -> bool:
    """A NUL byte, or more than 10 % control bytes and invalid UTF-8 (text in another
    8-bit encoding, such as a Latin-1 degree sign per line, stays well below)."""
    if b"\0" in head:
        return True
    bad = len(head) - len(head.translate(None, _CONTROL))
    bad += head.decode("utf-8", errors="replace").count("\ufffd")
    return bad > max(8, len(head) // 10)


@dataclass
class Rows:
    """Data rows as read, per GPU, before assembly."""

    t: dict[int, list[float]] = field(default_factory=dict)
    values: dict[int, list[list[float]]] = field(default_factory=dict)
    lines: dict[int, list[int]] = field(default_factory=dict)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)

    def add(self, line: int, gpu: int, t: float, values: list[float]) -> None:
        times = self.t.get(gpu)
        if times is None:
            times = self.t[gpu] = []
            self.values[gpu], self.lines[gpu] = [], []
        times.append(t)
        self.values[gpu].append(values)
        self.lines[gpu].append(line)


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


def assemble(path: str, fmt: str, rows: Rows, fields: list[str]) -> Trace:
    """Sorted, merged per-GPU series from the rows; stray timestamps skipped."""
    _drop_time_outliers(rows)
    skipped = sorted(rows.skipped)
    if not rows.t:
        where = f"{skipped[0][0]}: first skipped line: {skipped[0][1]}" if skipped else "1"
        raise TraceError(f"{path}:{where}: no usable data rows ({len(skipped)} skipped)")
    series: dict[int, GpuSeries] = {}
    for gpu in sorted(rows.t):
        t = np.asarray(rows.t[gpu], dtype=np.float64)
        v = np.asarray(rows.values[gpu], dtype=np.float64).reshape(len(t), len(fields))
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
        t, v = _merge_equal_times(t, v)
        series[gpu] = GpuSeries(gpu, t, {f: v[:, j].copy() for j, f in enumerate(fields)})
    return Trace(path, fmt, sorted(series), series, len(skipped), {}, skipped,
                 rejected=dict(rows.rejected))


def _drop_time_outliers(rows: Rows) -> None:
    every = [x for v in rows.t.values() for x in v]
    bounds = time_bounds(np.asarray(every, dtype=np.float64))
    if bounds is None:
        return
    lo, hi = bounds
    for gpu in list(rows.t):
        bad = [k for k, x in enumerate(rows.t[gpu]) if not lo <= x <= hi]
        for k in reversed(bad):
            rows.skipped.append((rows.lines[gpu][k], "timestamp far from the rest of the trace"))
            del rows.t[gpu][k], rows.values[gpu][k], rows.lines[gpu][k]
        if not rows.t[gpu]:
            del rows.t[gpu], rows.values[gpu], rows.lines[gpu]


def _merge_equal_times(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of one GPU with the same time become one row (later values win)."""
    if len(t) < 2 or np.all(np.diff(t) > 0):
        return t, v
    ut, start = np.unique(t, return_index=True)
    out = np.full((len(ut), v.shape[1]), np.nan)
    bounds = list(start) + [len(t)]
    for k in range(len(ut)):
        for r in range(bounds[k], bounds[k + 1]):
            row = v[r]
            ok = ~np.isnan(row)
            out[k, ok] = row[ok]
    return ut, out


# --------------------------------------------------------------------------- cte format


def _cte_header(path: str, line: str) -> dict[str, object]:
    try:
        meta = loads(line[len(CTE_MAGIC):].strip() or "{}")
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:1: bad cte header JSON: {exc.msg}") from None
    if not isinstance(meta, dict):
        raise TraceError(f"{path}:1: cte header must be a JSON object")
    return meta


def load_cte(path: str, lines: list[str], hline: int) -> Trace:
    meta = _cte_header(path, lines[hline])
    col_line = next((i for i in range(hline + 1, len(lines)) if lines[i].strip()
                     and not lines[i].startswith("#")), None)
    if col_line is None:
        raise TraceError(f"{path}:{hline + 2}: cte trace has no column line (t,gpu,...)")
    cols = [c.strip() for c in lines[col_line].split(",")]
    if cols[:2] != ["t", "gpu"] or len(cols) < 3:
        raise TraceError(f"{path}:{col_line + 1}: cte column line must start with t,gpu,FIELD")
    fields = cols[2:]
    if "power_watts" not in fields:
        raise TraceError(f"{path}:{col_line + 1}: cte trace has no power_watts column")
    rows = Rows()
    for ln in range(col_line + 1, len(lines)):
        raw = lines[ln]
        if not raw.strip() or raw.startswith("#"):
            continue
        try:
            gpu, t, values = _cte_row(raw, len(cols), fields, rows)
        except BadLine as exc:
            rows.skipped.append((ln + 1, str(exc)))
            continue
        rows.add(ln + 1, gpu, t, values)
    trace = assemble(path, "cte", rows, fields)
    trace.meta = meta
    tdp = meta.get("tdp_watts") or {}
    if isinstance(tdp, dict):
        for k, w in tdp.items():
            try:
                trace.tdp_watts[int(k)] = float(w)
            except (TypeError, ValueError):
                raise TraceError(f"{path}:1: bad tdp_watts entry {k!r}: {w!r}") from None
    avg = meta.get("power_averaging_seconds")
    trace.power_averaging_seconds = float(avg) if isinstance(avg, int | float) and avg > 0 \
        else None
    trace.power_averaging_stated = "power_averaging_seconds" in meta
    names = meta.get("gpu_names")
    if isinstance(names, dict):
        trace.gpu_names = {int(k): str(v)[:200] for k, v in names.items()
                           if str(k).isdigit() and int(k) in trace.series}
    return trace


def _cte_row(raw: str, ncells: int, fields: list[str], rows: Rows
             ) -> tuple[int, float, list[float]]:
    cells = raw.split(",")
    if len(cells) != ncells:
        raise BadLine(f"{len(cells)} cells, column line has {ncells}")
    nan = math.nan
    try:
        t = float(cells[0])
        try:  # as written by TraceWriter: a number or an empty cell
            values = [float(c) if c else nan for c in cells[2:]]
        except ValueError:  # blank cells of spaces are missing values too
            values = [float(c) if c.strip() else nan for c in cells[2:]]
    except ValueError:
        raise BadLine("unparsable number") from None
    if not (math.isfinite(t) and t >= 0):
        raise BadLine(f"bad time {cells[0].strip()!r}")
    gpu = gpu_index(cells[1])
    # a written "nan" is no missing value (that is an empty cell): count it
    if "n" in raw or "N" in raw:  # no NaN can be written without one
        for name, c, v in zip(fields, cells[2:], values, strict=True):
            if c.strip() and math.isnan(v):
                rows.rejected[f"{name} not a number"] += 1
    return gpu, t, screen(fields, values, rows.rejected)


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
