"""A trace field of every GPU on analyze's power grid, made a block of grid columns at a
time when the straggler scan reads it.

A long trace's grid is over a million samples a GPU: each field whole would be another
8 bytes per GPU and sample (three fields of a 1 GB trace: ~210 MB). The scan reads its
windows in time order, so a block (``BLOCK`` columns) is made once and the windows in
it are cut from it. Each value is the one the whole grid would hold: the interpolation
reads, for each grid time, the same two readings either side of it (the block's slice of
the readings reaches past the block to them), and a gap's NaN is put where it would be.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from exporter.analysis.signal import ColumnBlocks
from exporter.offline.gaps import gpu_gaps
from exporter.traces.trace import GpuSeries, PackedFields

BLOCK = 1 << 14  # grid columns made at a time (8 GPUs: 1 MiB of float64)
HELD = "clock_event_reasons"  # a bitmask: its last reading holds, never interpolated


def field_part(fields: Mapping[str, np.ndarray], name: str, start: int, stop: int
               ) -> np.ndarray:
    """Readings ``start:stop`` of one field as float64 in base units, without unpacking
    the rest of the field."""
    if isinstance(fields, PackedFields):
        return fields.part(name, start, stop)
    return np.asarray(fields[name][start:stop], dtype=np.float64)


def finite(fields: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    """Which readings of one field are finite, without unpacking the field (a packed
    float32 value is finite where its float64 is)."""
    if isinstance(fields, PackedFields):
        return fields.finite(name)
    return np.isfinite(fields[name])


class _Readings:
    """One GPU's finite readings of one field, found a slice at a time."""

    def __init__(self, s: GpuSeries, name: str, first: int, last: int, t0: float) -> None:
        self.s, self.name, self.t0 = s, name, t0
        self.first, self.last = first, last  # indices of the first and last finite reading
        self.end = float(s.t[last] - t0)  # the last finite reading's time, from t0

    def around(self, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
        """(times from t0, values) of the finite readings from the last at or before
        ``lo`` (or the first) to the first at or after ``hi`` (or the last)."""
        t = self.s.t
        a = max(self.first, int(np.searchsorted(t, self.t0 + lo)) - 2)
        b = min(self.last + 1, int(np.searchsorted(t, self.t0 + hi)) + 2)
        step = 64
        while True:
            ts = t[a:b] - self.t0
            x = field_part(self.s.fields, self.name, a, b)
            ok = np.isfinite(x)
            ts, x = ts[ok], x[ok]
            # widen where a NaN run (or rounding of t0 + lo) hides the reading needed
            short_a = a > self.first and not (ts.size and ts[0] <= lo)
            short_b = b <= self.last and not (ts.size and ts[-1] >= hi)
            if not (short_a or short_b):
                return ts, x
            if short_a:
                a = max(self.first, a - step)
            if short_b:
                b = min(self.last + 1, b + step)
            step *= 2


class FieldGrid(ColumnBlocks):
    """A field of every GPU on the grid ``rel`` (seconds from ``t0``), ``(GPUs, samples)``:
    indexing ``[:, a:b]`` gives that block's float64 values (NaN outside a GPU's readings
    and inside a gap in them), what the whole grid would hold there."""

    def __init__(self, series: list[GpuSeries | None], name: str, t0: float,
                 rel: np.ndarray, dt: float, block: int = BLOCK,
                 gap_cache: dict[int, tuple[np.ndarray, list[tuple[float, float]]]] | None
                 = None) -> None:
        self.name, self.t0, self.rel, self.dt = name, t0, rel, dt
        self.block_columns = block
        self.shape = (len(series), rel.size)
        self._rows: list[_Readings | None] = []
        self.gaps: list[list[tuple[float, float]]] = []  # per GPU, from t0
        # the gaps of a field read at every one of a GPU's times are those of the times:
        # GPUs that share one array of times (one poll's), and fields, find them once
        cache = {} if gap_cache is None else gap_cache
        for s in series:
            ok = None if s is None or name not in s.fields else finite(s.fields, name)
            if s is None or ok is None or not ok.any():
                self._rows.append(None)
                self.gaps.append([])
                continue
            if ok.all():
                first, last = 0, ok.size - 1
                seen = cache.get(id(s.t))
                if seen is None or seen[0] is not s.t:
                    seen = cache[id(s.t)] = (s.t, gpu_gaps(s.t - t0))
                self.gaps.append(seen[1])
            else:
                where = np.flatnonzero(ok)
                first, last = int(where[0]), int(where[-1])
                del where
                self.gaps.append(gpu_gaps(s.t[ok] - t0))
            del ok
            self._rows.append(_Readings(s, name, first, last, t0))

    @property
    def has_readings(self) -> bool:
        return any(r is not None for r in self._rows)

    def block(self, a: int, b: int) -> np.ndarray:
        """The grid's columns a..b-1 (a new array)."""
        out = np.full((self.shape[0], max(0, b - a)), np.nan)
        if b <= a:
            return out
        rel = self.rel[a:b]
        for i, r in enumerate(self._rows):
            if r is None:
                continue
            ts, xs = r.around(float(rel[0]), float(rel[-1]))
            if self.name == HELD:
                # the reading at or before each grid time (idx < 0: none yet)
                # (the slice starts at the first reading or at one at or before rel[0],
                # so each grid time finds the reading the whole readings would give)
                idx = np.searchsorted(ts, rel, side="right") - 1
                out[i] = np.where(idx >= 0, xs[np.maximum(idx, 0)], np.nan)
                out[i, rel > r.end + 5 * self.dt + 5.0] = np.nan
            else:
                out[i] = np.interp(rel, ts, xs, left=np.nan, right=np.nan)
            for ga, gb in self.gaps[i]:
                if gb > rel[0] and ga < rel[-1]:
                    out[i, (rel > ga) & (rel < gb)] = np.nan
        return out

    def any_finite(self) -> bool:
        """Whether any value of the grid is finite (a block at a time)."""
        return any(np.isfinite(self[:, a:min(self.shape[1], a + self.block_columns)]).any()
                   for a in range(0, self.shape[1], self.block_columns))
