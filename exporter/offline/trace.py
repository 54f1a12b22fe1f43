"""Traces: per-GPU time series read from a file, and the writer of our own format.

Two formats are read, sniffed from the first non-blank line:

- ``nvidia-smi``: the CSV that ``nvidia-smi --query-gpu=... --format=csv`` prints
  (with or without ``nounits``/``-lms``, or a shell loop that repeats the header);
- ``cte``: the exporter's own recording (see ``docs/trace-format.md``), written by
  :class:`TraceWriter`.

Fatal problems raise :class:`TraceError` with a message ``FILE:LINE: message``.
Malformed data lines are skipped: their count is ``Trace.skipped_lines`` and their
line numbers (with the reason) are in ``Trace.skipped``.

Unit policy (nvidia-smi): a unit in the *header* that is not known for that column
is fatal (every line would be misread); a unit on a *value* that is not known is a
malformed line, skipped and counted like any other.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO

import numpy as np

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
    # average on Ampere and newer except GA100), "power.draw.average" or, for
    # cte traces, "power_watts" (instant power sampled by the exporter).
    power_column: str = "power_watts"
    # Seconds over which the power sensor averages, when known (1.0 for power.draw).
    power_averaging_seconds: float | None = None


# --------------------------------------------------------------------------- nvidia-smi


@dataclass(frozen=True)
class _Column:
    canonical: str | None  # None: used for tdp only
    units: Mapping[str, float]  # unit (lower case; "" = no unit) -> factor to base units
    hex_ok: bool = False


_W = {"": 1.0, "w": 1.0, "mw": 1e-3, "kw": 1e3}
_PCT = {"": 0.01, "%": 0.01}
_CLOCK = {"": 1e6, "mhz": 1e6, "hz": 1.0, "khz": 1e3, "ghz": 1e9}
_TEMP = {"": 1.0, "c": 1.0, "°c": 1.0}
_MEM = {"": 2.0**20, "mib": 2.0**20, "kib": 2.0**10, "gib": 2.0**30, "b": 1.0, "bytes": 1.0}
_ENERGY = {"": 1e-3, "mj": 1e-3, "j": 1.0}

# nvidia-smi query names -> canonical field.  Several names can feed one field;
# _POWER_PREFERENCE decides which becomes power_watts.
_NVSMI_COLUMNS: dict[str, _Column] = {
    "power.draw": _Column("power_watts", _W),
    "power.draw.instant": _Column("power_watts", _W),
    "power.draw.average": _Column("power_average_watts", _W),
    "power.limit": _Column("power_limit_watts", _W),
    "enforced.power.limit": _Column("power_limit_watts", _W),
    "power.default_limit": _Column(None, _W),
    "temperature.gpu": _Column("temperature_celsius", _TEMP),
    "temperature.memory": _Column("memory_temperature_celsius", _TEMP),
    "utilization.gpu": _Column("utilization_gpu_ratio", _PCT),
    "utilization.memory": _Column("utilization_memory_ratio", _PCT),
    "clocks.current.sm": _Column("sm_clock_hertz", _CLOCK),
    "clocks.sm": _Column("sm_clock_hertz", _CLOCK),
    "clocks.current.memory": _Column("memory_clock_hertz", _CLOCK),
    "clocks.mem": _Column("memory_clock_hertz", _CLOCK),
    "memory.used": _Column("memory_used_bytes", _MEM),
    "total_energy_consumption": _Column("energy_joules", _ENERGY),
    "clocks_event_reasons.active": _Column("clock_event_reasons", {"": 1.0}, hex_ok=True),
    "clocks_throttle_reasons.active": _Column("clock_event_reasons", {"": 1.0}, hex_ok=True),
}
_POWER_PREFERENCE = ("power.draw.instant", "power.draw", "power.draw.average")
_MISSING = {"", "[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]",
            "[insufficient permissions]", "[gpu is lost]", "[gpu requires reset]"}
_HEADER_RE = re.compile(r"^\s*([A-Za-z0-9_.]+)\s*(?:\[([^\]]*)\])?\s*$")
_VALUE_RE = re.compile(r"^([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(\S*)$")
_TS_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f",
               "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S")


class _BadLine(Exception):
    pass


def _parse_timestamp(text: str, cache: dict[str, float]) -> float:
    """nvidia-smi's local-time stamp, read as if it were UTC (consistently)."""
    hit = cache.get(text)
    if hit is not None:
        return hit
    for fmt in _TS_FORMATS:
        try:
            d = _dt.datetime.strptime(text, fmt)
        except ValueError:
            continue
        value = d.replace(tzinfo=_dt.UTC).timestamp()
        cache[text] = value
        return value
    try:  # a loop that writes `date +%s.%N` instead
        value = float(text)
    except ValueError:
        raise _BadLine(f"unparsable timestamp {text!r}") from None
    if not math.isfinite(value):
        raise _BadLine(f"unparsable timestamp {text!r}")
    cache[text] = value
    return value


def _parse_value(text: str, col: _Column, header_unit: str | None, name: str) -> float:
    s = text.strip()
    if s.lower() in _MISSING:
        return math.nan
    if col.hex_ok and s.lower().startswith("0x"):
        try:
            return float(int(s, 16))
        except ValueError:
            raise _BadLine(f"{name}: unparsable value {s!r}") from None
    m = _VALUE_RE.match(s)
    if m is None:
        raise _BadLine(f"{name}: unparsable value {s!r}")
    unit = m.group(2).lower()
    if unit == "":
        unit = header_unit or ""
    factor = col.units.get(unit)
    if factor is None:
        raise _BadLine(f"{name}: unknown unit {m.group(2)!r}")
    return float(m.group(1)) * factor


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8-sig", errors="replace", newline="") as fh:
            return fh.read().splitlines()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None


def load_trace(path: str | os.PathLike[str], gpus: int | None = None) -> Trace:
    """Read a trace file, sniffing its format.

    ``gpus`` assigns rows to GPUs in order (row i -> GPU i % gpus) for nvidia-smi
    logs without an ``index`` column; it is ignored when the file says which GPU.
    """
    p = os.fspath(path)
    if gpus is not None and gpus < 1:
        raise TraceError(f"{p}: --gpus must be at least 1, got {gpus}")
    lines = _read_lines(p)
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        raise TraceError(f"{p}:1: empty file: no header line")
    if lines[first].startswith(CTE_MAGIC):
        return _load_cte(p, lines, first)
    return _load_nvidia_smi(p, lines, first, gpus)


def _load_nvidia_smi(path: str, lines: list[str], hline: int, gpus: int | None) -> Trace:
    header = [h.strip() for h in lines[hline].split(",")]
    lineno = hline + 1
    names: list[str] = []
    units: list[str | None] = []
    for cell in header:
        m = _HEADER_RE.match(cell)
        if m is None:
            raise TraceError(
                f"{path}:{lineno}: not an nvidia-smi CSV header (cell {cell!r}); expected "
                "the output of `nvidia-smi --query-gpu=... --format=csv` or a cte trace"
            )
        names.append(m.group(1).lower())
        units.append(m.group(2).strip().lower() if m.group(2) is not None else None)
    for name, unit in zip(names, units, strict=True):
        col = _NVSMI_COLUMNS.get(name)
        if col is not None and unit is not None and unit not in col.units:
            raise TraceError(f"{path}:{lineno}: column {name!r}: unknown unit [{unit}]")
    power_name = next((n for n in _POWER_PREFERENCE if n in names), None)
    if power_name is None:
        raise TraceError(
            f"{path}:{lineno}: no power column (power.draw, power.draw.instant or "
            "power.draw.average) in the header"
        )
    if "timestamp" not in names:
        raise TraceError(f"{path}:{lineno}: no timestamp column in the header")
    ts_i = names.index("timestamp")
    idx_i = names.index("index") if "index" in names else None
    if idx_i is None and gpus is None:
        raise TraceError(
            f"{path}:{lineno}: no index column, so rows cannot be assigned to GPUs: "
            "pass --gpus N (row i belongs to GPU i % N)"
        )
    # (cell position, canonical field, column) for every known column
    used: list[tuple[int, str, _Column, str | None]] = []
    tdp_i: int | None = None
    for i, (name, unit) in enumerate(zip(names, units, strict=True)):
        col = _NVSMI_COLUMNS.get(name)
        if col is None:
            continue
        if name == "power.default_limit":
            tdp_i = i
            continue
        canonical = col.canonical
        if name in _POWER_PREFERENCE:
            if name == power_name:
                canonical = "power_watts"
            elif name == "power.draw.average" or (
                name == "power.draw" and "power.draw.average" not in names
            ):
                canonical = "power_average_watts"
            else:
                continue
        assert canonical is not None
        used.append((i, canonical, col, unit))

    ncells = len(names)
    ts_cache: dict[str, float] = {}
    rows_t: dict[int, list[float]] = {}
    rows_v: dict[int, list[list[float]]] = {}
    tdp_rows: dict[int, list[float]] = {}
    skipped: list[tuple[int, str]] = []
    row_no = 0
    header_line = lines[hline].strip()
    for ln in range(hline + 1, len(lines)):
        raw = lines[ln]
        if not raw.strip() or raw.strip() == header_line:
            continue  # blank, or the header repeated by a shell loop
        cells = raw.split(",")
        try:
            if len(cells) != ncells:
                raise _BadLine(f"{len(cells)} cells, header has {ncells}")
            t = _parse_timestamp(cells[ts_i].strip(), ts_cache)
            if idx_i is not None:
                try:
                    gpu = int(cells[idx_i].strip())
                except ValueError:
                    raise _BadLine(f"unparsable index {cells[idx_i].strip()!r}") from None
                if gpu < 0:
                    raise _BadLine(f"negative index {gpu}")
            else:
                assert gpus is not None
                gpu = row_no % gpus
            values = [_parse_value(cells[i], col, unit, names[i]) for i, _, col, unit in used]
            tdp = (
                _parse_value(cells[tdp_i], _NVSMI_COLUMNS["power.default_limit"],
                             units[tdp_i], names[tdp_i])
                if tdp_i is not None else math.nan
            )
        except _BadLine as exc:
            skipped.append((ln + 1, str(exc)))
            continue
        row_no += 1
        rows_t.setdefault(gpu, []).append(t)
        rows_v.setdefault(gpu, []).append(values)
        tdp_rows.setdefault(gpu, []).append(tdp)

    fields = [canonical for _, canonical, _, _ in used]
    trace = _assemble(path, "nvidia-smi", rows_t, rows_v, fields, skipped)
    trace.power_column = power_name
    trace.power_averaging_seconds = 1.0 if power_name in ("power.draw", "power.draw.average") \
        else None
    for gpu, s in trace.series.items():
        tdp_arr = np.asarray(tdp_rows[gpu], dtype=float)
        if np.isfinite(tdp_arr).any():
            trace.tdp_watts[gpu] = float(np.nanmedian(tdp_arr))
        elif "power_limit_watts" in s.fields and np.isfinite(s.fields["power_limit_watts"]).any():
            trace.tdp_watts[gpu] = float(np.nanmedian(s.fields["power_limit_watts"]))
    return trace


def _assemble(path: str, fmt: str, rows_t: dict[int, list[float]],
              rows_v: dict[int, list[list[float]]], fields: list[str],
              skipped: list[tuple[int, str]]) -> Trace:
    if not rows_t:
        where = f"{skipped[0][0]}: first skipped line: {skipped[0][1]}" if skipped else "1"
        raise TraceError(f"{path}:{where}: no usable data rows ({len(skipped)} skipped)")
    series: dict[int, GpuSeries] = {}
    for gpu in sorted(rows_t):
        t = np.asarray(rows_t[gpu], dtype=np.float64)
        v = np.asarray(rows_v[gpu], dtype=np.float64).reshape(len(t), len(fields))
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
        t, v = _merge_equal_times(t, v)
        series[gpu] = GpuSeries(gpu, t, {f: v[:, j].copy() for j, f in enumerate(fields)})
    return Trace(path, fmt, sorted(series), series, len(skipped), {}, skipped)


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
        meta = json.loads(line[len(CTE_MAGIC):].strip() or "{}")
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:1: bad cte header JSON: {exc.msg}") from None
    if not isinstance(meta, dict):
        raise TraceError(f"{path}:1: cte header must be a JSON object")
    return meta


def _load_cte(path: str, lines: list[str], hline: int) -> Trace:
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
    ncells = len(cols)
    rows_t: dict[int, list[float]] = {}
    rows_v: dict[int, list[list[float]]] = {}
    skipped: list[tuple[int, str]] = []
    for ln in range(col_line + 1, len(lines)):
        raw = lines[ln]
        if not raw.strip() or raw.startswith("#"):
            continue
        cells = raw.split(",")
        try:
            if len(cells) != ncells:
                raise _BadLine(f"{len(cells)} cells, column line has {ncells}")
            t = float(cells[0])
            gpu = int(cells[1])
            if not math.isfinite(t) or gpu < 0:
                raise ValueError
            values = [float(c) if c.strip() else math.nan for c in cells[2:]]
        except (ValueError, _BadLine) as exc:
            reason = str(exc) if isinstance(exc, _BadLine) else "unparsable number"
            skipped.append((ln + 1, reason))
            continue
        rows_t.setdefault(gpu, []).append(t)
        rows_v.setdefault(gpu, []).append(values)
    trace = _assemble(path, "cte", rows_t, rows_v, fields, skipped)
    tdp = meta.get("tdp_watts") or {}
    if isinstance(tdp, dict):
        for k, w in tdp.items():
            try:
                trace.tdp_watts[int(k)] = float(w)
            except (TypeError, ValueError):
                raise TraceError(f"{path}:1: bad tdp_watts entry {k!r}: {w!r}") from None
    avg = meta.get("power_averaging_seconds")
    trace.power_averaging_seconds = float(avg) if isinstance(avg, int | float) else None
    return trace


def _fmt(v: float) -> str:
    return "" if v is None or math.isnan(v) else repr(float(v))


class TraceWriter:
    """Append-only writer of the cte trace format (see docs/trace-format.md).

    Rows may carry only some fields (power at ~20 Hz, the rest at ~1 Hz): the
    others are left empty.  With ``append=True`` an existing file with the same
    columns is extended; a fresh file gets the header.
    """

    def __init__(self, path: str | os.PathLike[str], gpus: Iterable[int],
                 tdp_watts: Mapping[int, float] | None, fields: Iterable[str], *,
                 host: str | None = None, started_at: float | None = None,
                 append: bool = False, power_averaging_seconds: float | None = None) -> None:
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
        meta = {
            "gpus": self.gpus,
            "tdp_watts": {str(k): float(v) for k, v in (tdp_watts or {}).items()},
            "fields": self.fields,
            "started_at": started_at,
            "host": host,
            "power_averaging_seconds": power_averaging_seconds,
        }
        self._fh = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
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

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
