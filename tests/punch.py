"""Holes punched into a real nvidia-smi log, as busy hosts leave them (the poll loop stalls
on every GPU at once, or on some GPUs), for the tests of how analyses bridge holes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

Holes = Sequence[tuple[float, float]]  # (start, end) in seconds from the log's first line


def every(period: float, length: float, until: float, first: float = 0.0
          ) -> list[tuple[float, float]]:
    """A hole of `length` s every `period` s, from `first` on: (a)."""
    return [(a, a + length) for a in np.arange(first, until, period).tolist()]


def at_random(seed: int, until: float, mean_every: float = 12.0, lo: float = 1.0,
              hi: float = 3.0) -> list[tuple[float, float]]:
    """Holes of lo-hi s at random times, one every `mean_every` s on average: (b), and per
    GPU with a seed each, (c)."""
    rng = np.random.default_rng(seed)
    out, t = [], float(rng.uniform(0, mean_every))
    while t < until:
        length = float(rng.uniform(lo, hi))
        out.append((t, t + length))
        t += length + float(rng.exponential(mean_every))
    return out


def _seconds(stamp: str) -> float:
    return dt.datetime.strptime(stamp.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()


def punch(src: Path, dst: Path, all_gpus: Holes = (),
          per_gpu: Mapping[int, Holes] | None = None) -> Path:
    """Copy an nvidia-smi CSV log (timestamp, index, ...) without the lines inside the holes:
    `all_gpus` on every GPU, `per_gpu` on one GPU each."""
    lines = src.read_text().splitlines(keepends=True)
    t0 = _seconds(lines[1].split(",", 1)[0])
    kept = [lines[0]]
    for line in lines[1:]:
        stamp, index, _ = line.split(",", 2)
        r = _seconds(stamp) - t0
        holes = [*all_gpus, *(per_gpu or {}).get(int(index), ())]
        if not any(a < r < b for a, b in holes):
            kept.append(line)
    dst.write_text("".join(kept))
    return dst
