"""Reader of nvidia-smi CSV logs (``nvidia-smi --query-gpu=... --format=csv``).

With or without ``nounits``/``-lms``, or from a shell loop that repeats the
header.  Columns are recognised by name (see docs/trace-format.md); a ``name``
column (the GPU model) is kept per GPU, because it tells whether ``power.draw``
is a 1 s average (exporter.offline.band).

Unit policy: a unit in the *header* that is not known for that column is fatal
(every line would be misread); a unit on a *value* that is not known is a
malformed line, skipped and counted like any other.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from exporter.traces.checks import screen
from exporter.traces.reading import Rows, assemble
from exporter.traces.trace import BadLine, Trace, TraceError, gpu_index

_MAX_TDPS = 10_000  # distinct power.default_limit values counted per GPU (a board has one)
_MAX_CACHED_STAMPS = 10_000  # parsed timestamps remembered (one per poll is read again)


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
        raise BadLine(f"unparsable timestamp {text!r}") from None
    if not math.isfinite(value):
        raise BadLine(f"unparsable timestamp {text!r}")
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
            raise BadLine(f"{name}: unparsable value {s!r}") from None
    m = _VALUE_RE.match(s)
    if m is None:
        raise BadLine(f"{name}: unparsable value {s!r}")
    unit = m.group(2).lower()
    if unit == "":
        unit = header_unit or ""
    factor = col.units.get(unit)
    if factor is None:
        raise BadLine(f"{name}: unknown unit {m.group(2)!r}")
    return float(m.group(1)) * factor


@dataclass(frozen=True)
class _Header:
    names: list[str]
    units: list[str | None]
    power_name: str
    ts_i: int
    idx_i: int | None
    name_i: int | None  # the GPU model's column
    tdp_i: int | None  # power.default_limit
    used: list[tuple[int, str, _Column, str | None]]  # (cell, canonical field, column, unit)


def load_nvidia_smi(path: str, header: tuple[int, str], lines: Iterator[tuple[int, str]],
                    gpus: int | None, keep: Collection[str] | None = None) -> Trace:
    """Read an nvidia-smi log whose header is ``header`` (line number, text); ``lines``:
    the numbered lines after it; ``keep``: the fields to keep (None: all)."""
    h = _parse_header(path, header[1], header[0], gpus)
    fields = [canonical for _, canonical, _, _ in h.used]
    rows = Rows(path, fields, keep, [col.units.get(unit or "", 1.0) for _, _, col, unit in h.used])
    tdps: dict[int, Counter[float]] = {}
    names: dict[int, str] = {}
    ts_cache: dict[str, float] = {}
    header_line = header[1].strip()
    for ln, raw in lines:
        if not raw.strip() or raw.strip() == header_line:
            continue  # blank, or the header repeated by a shell loop
        try:
            gpu, t, values, tdp, name = _parse_row(raw, h, ts_cache, rows, gpus)
        except BadLine as exc:
            rows.skip(ln, str(exc))
            continue
        rows.add(ln, gpu, t, screen(fields, values, rows.rejected))
        if 0 < tdp <= 5000:  # NaN is not
            seen = tdps.setdefault(gpu, Counter())
            if tdp in seen or len(seen) < _MAX_TDPS:
                seen[tdp] += 1
        if name:
            names.setdefault(gpu, name)
        if len(ts_cache) > _MAX_CACHED_STAMPS:  # a stamp per poll: keep the cache small
            ts_cache.clear()
    trace = assemble(path, "nvidia-smi", rows)
    trace.power_column = h.power_name
    trace.power_averaging_stated = h.power_name != "power.draw"
    trace.power_averaging_seconds = 1.0 if h.power_name == "power.draw.average" else None
    trace.gpu_names = {g: n for g, n in names.items() if g in trace.series}
    _set_tdp(trace, tdps)
    return trace


def _set_tdp(trace: Trace, tdps: dict[int, Counter[float]]) -> None:
    for gpu, s in trace.series.items():
        limits = s.fields.get("power_limit_watts")
        if tdps.get(gpu):
            trace.tdp_watts[gpu] = _median(tdps[gpu])
        elif limits is not None and np.isfinite(limits).any():
            trace.tdp_watts[gpu] = float(np.nanmedian(limits))


def _median(counts: Counter[float]) -> float:
    """The median of the values counted, as numpy's median of them all gives it."""
    n = sum(counts.values())
    want = ((n - 1) // 2, n // 2)  # the middle one, or the middle two
    middle: list[float] = []
    seen = 0
    for v in sorted(counts):
        seen += counts[v]
        while len(middle) < 2 and want[len(middle)] < seen:
            middle.append(v)
    return float(np.mean(middle))


def _parse_header(path: str, line: str, lineno: int, gpus: int | None) -> _Header:
    names: list[str] = []
    units: list[str | None] = []
    for cell in (c.strip() for c in line.split(",")):
        m = _HEADER_RE.match(cell)
        if m is None:
            raise TraceError(
                f"{path}:{lineno}: not an nvidia-smi CSV header (cell {cell[:80]!r}); expected "
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
    idx_i = names.index("index") if "index" in names else None
    if idx_i is None and gpus is None:
        raise TraceError(
            f"{path}:{lineno}: no index column, so rows cannot be assigned to GPUs: "
            "pass --gpus N (row i belongs to GPU i % N)"
        )
    name_i = next((names.index(n) for n in ("name", "gpu_name") if n in names), None)
    tdp_i = names.index("power.default_limit") if "power.default_limit" in names else None
    return _Header(names, units, power_name, names.index("timestamp"), idx_i, name_i, tdp_i,
                   _used_columns(names, units, power_name))


def _used_columns(names: list[str], units: list[str | None], power_name: str
                  ) -> list[tuple[int, str, _Column, str | None]]:
    """(cell, canonical field, column, unit) for every known column but the TDP's."""
    used = []
    for i, (name, unit) in enumerate(zip(names, units, strict=True)):
        col = _NVSMI_COLUMNS.get(name)
        if col is None or name == "power.default_limit":
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
    return used


def _parse_row(raw: str, h: _Header, ts_cache: dict[str, float], rows: Rows,
               gpus: int | None) -> tuple[int, float, list[float], float, str | None]:
    """(gpu, time, values of h.used, TDP or NaN, GPU name or None) of one data line."""
    cells = raw.split(",")
    if len(cells) != len(h.names):
        raise BadLine(f"{len(cells)} cells, header has {len(h.names)}")
    t = _parse_timestamp(cells[h.ts_i].strip(), ts_cache)
    if h.idx_i is not None:
        gpu = gpu_index(cells[h.idx_i])
    else:
        assert gpus is not None
        gpu = rows.count % gpus
    values = [_parse_value(cells[i], col, unit, h.names[i]) for i, _, col, unit in h.used]
    tdp = math.nan
    if h.tdp_i is not None:
        tdp = _parse_value(cells[h.tdp_i], _NVSMI_COLUMNS["power.default_limit"],
                           h.units[h.tdp_i], h.names[h.tdp_i])
    name = cells[h.name_i].strip()[:200] if h.name_i is not None else None
    return gpu, t, values, tdp, name or None
