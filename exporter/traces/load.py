"""Reading a trace file of either format (ours or nvidia-smi CSV), sniffed from its
first non-blank line, plain or gzip-compressed (sniffed from its magic bytes)."""

from __future__ import annotations

import os

from exporter.traces.nvsmi import load_nvidia_smi
from exporter.traces.trace import CTE_MAGIC, Trace, TraceError, load_cte, read_lines


def load_trace(path: str | os.PathLike[str], gpus: int | None = None) -> Trace:
    """Read a trace file, sniffing its format.

    ``gpus`` assigns rows to GPUs in order (row i -> GPU i % gpus) for nvidia-smi
    logs without an ``index`` column; it is ignored when the file says which GPU.
    """
    p = os.fspath(path)
    if gpus is not None and gpus < 1:
        raise TraceError(f"{p}: --gpus must be at least 1, got {gpus}")
    lines = read_lines(p)
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        raise TraceError(f"{p}:1: empty file: no header line")
    if lines[first].startswith(CTE_MAGIC):
        return load_cte(p, lines, first)
    return load_nvidia_smi(p, lines, first, gpus)
