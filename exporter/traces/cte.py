"""Reader of the exporter's own trace format (``cte``, see docs/trace-format.md)."""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterator

from exporter.jsontext import loads
from exporter.traces.checks import screen
from exporter.traces.reading import Rows, assemble
from exporter.traces.trace import CTE_MAGIC, BadLine, Trace, TraceError, gpu_index


def _cte_header(path: str, line: str) -> dict[str, object]:
    try:
        meta = loads(line[len(CTE_MAGIC):].strip() or "{}")
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:1: bad cte header JSON: {exc.msg}") from None
    if not isinstance(meta, dict):
        raise TraceError(f"{path}:1: cte header must be a JSON object")
    return meta


def load_cte(path: str, header: tuple[int, str], lines: Iterator[tuple[int, str]],
             keep: Collection[str] | None = None) -> Trace:
    """Read a cte trace whose header is ``header`` (line number, text); ``lines``: the
    numbered lines after it; ``keep``: the fields to keep (None: all)."""
    hline, htext = header
    meta = _cte_header(path, htext)
    col_line = next(((ln, raw) for ln, raw in lines if raw.strip() and not raw.startswith("#")),
                    None)
    if col_line is None:
        raise TraceError(f"{path}:{hline + 1}: cte trace has no column line (t,gpu,...)")
    cols = [c.strip() for c in col_line[1].split(",")]
    if cols[:2] != ["t", "gpu"] or len(cols) < 3:
        raise TraceError(f"{path}:{col_line[0]}: cte column line must start with t,gpu,FIELD")
    fields = cols[2:]
    if "power_watts" not in fields:
        raise TraceError(f"{path}:{col_line[0]}: cte trace has no power_watts column")
    rows = Rows(path, fields, keep)
    for ln, raw in lines:
        if not raw.strip() or raw.startswith("#"):
            continue
        try:
            gpu, t, values = _cte_row(raw, len(cols), fields, rows)
        except BadLine as exc:
            rows.skip(ln, str(exc))
            continue
        rows.add(ln, gpu, t, values)
    trace = assemble(path, "cte", rows)
    _apply_meta(path, trace, meta)
    return trace


def _apply_meta(path: str, trace: Trace, meta: dict[str, object]) -> None:
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
