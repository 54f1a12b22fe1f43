"""Reading a trace file of either format (ours or nvidia-smi CSV), sniffed from its
first non-blank line, plain or gzip-compressed (sniffed from its magic bytes), a block
at a time (exporter.traces.reading)."""

from __future__ import annotations

import os
from collections.abc import Collection

from exporter.traces.cte import load_cte
from exporter.traces.nvsmi import load_nvidia_smi
from exporter.traces.reading import Progress, TextLines
from exporter.traces.trace import CTE_MAGIC, Trace, TraceError


def load_trace(path: str | os.PathLike[str], gpus: int | None = None, *,
               fields: Collection[str] | None = None,
               progress: Progress | None = None) -> Trace:
    """Read a trace file, sniffing its format.

    ``gpus`` assigns rows to GPUs in order (row i -> GPU i % gpus) for nvidia-smi
    logs without an ``index`` column; it is ignored when the file says which GPU.
    ``fields``: the canonical fields to keep (None: every one the file has); the others
    are read, checked and dropped, so they cost no memory. ``progress(done, size)``
    hears how many bytes of the file have been read.
    """
    p = os.fspath(path)
    if gpus is not None and gpus < 1:
        raise TraceError(f"{p}: --gpus must be at least 1, got {gpus}")
    text = TextLines(p, progress)
    try:
        lines = text.lines()
        first = next(((ln, raw) for ln, raw in lines if raw.strip()), None)
        if first is None:
            raise TraceError(f"{p}:1: empty file: no header line")
        if first[1].startswith(CTE_MAGIC):
            return load_cte(p, first, lines, fields)
        return load_nvidia_smi(p, first, lines, gpus, fields)
    finally:
        text.close()
