"""Bounded ring buffers: memory fixed at start, independent of uptime (the power ring's
pages are resident once its first window has filled them).

- PowerBuffer: each GPU's power samples at their native rate, with the driver's own
  timestamps (GPUs arrive at different times and rates: one ring per GPU), held as whole
  microseconds in 32 bits after a per-GPU epoch, as the driver stamps them (float64
  seconds only where a time is not a whole microsecond). Power is held
  as whole milliwatts in float32, which the driver reports (NVML gives integer mW) and
  float32 holds exactly up to 16.7 kW: read back as watts, each value is the float64 it
  was written as, in half the memory (1.3 MiB less for 8 GPUs and 660 s).
- SweepBuffer: one row per sweep, a time and named values per GPU (the straggler
  window's SM clock, temperature, utilization, clock events).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable

import numpy as np

_MICRO = 1e6
_SPAN_US = 2**32  # what a uint32 holds: 71.6 minutes of microseconds


class PowerBuffer:
    def __init__(self, gpus: int, capacity: int, span_seconds: float = 0.0):
        self.capacity = capacity
        self.span_seconds = span_seconds  # the time it is sized for (readers' bound)
        # zeros, not NaN: the kernel's zero pages, made resident as samples fill them; no
        # reader looks past a GPU's count. Times as whole microseconds after each GPU's
        # epoch in 32 bits (the driver stamps whole microseconds): 2.6 MiB for 8 GPUs and
        # 660 s with the milliwatts, where float64 seconds took 3.9. A time that is not a
        # whole microsecond (a polled GPU's wall clock, a re-based driver clock), or a
        # GPU's samples spanning more than 71 minutes, turns the ring to float64 seconds.
        self._micros: np.ndarray | None = np.zeros((gpus, capacity), dtype=np.uint32)
        self._epoch = [0] * gpus  # each GPU's microsecond 0 (its first sample's)
        self._seconds: np.ndarray | None = None  # float64 times, once a time needs them
        self.milliwatts = np.zeros((gpus, capacity), dtype=np.float32)
        self.count = [0] * gpus  # samples ever written, per GPU
        # each GPU's newest time as a float (what append() compares against), so a drain
        # does not index the ring for it
        self._newest = [-math.inf] * gpus
        self._lock = threading.Lock()

    @property
    def gpus(self) -> int:
        return self.milliwatts.shape[0]

    @property
    def times(self) -> np.ndarray:
        """The array the times are held in (uint32 microseconds, or float64 seconds)."""
        held = self._micros if self._micros is not None else self._seconds
        assert held is not None  # one of the two, always
        return held

    @property
    def nbytes(self) -> int:
        return self.times.nbytes + self.milliwatts.nbytes

    def _decode(self, gpu: int, held: np.ndarray) -> np.ndarray:
        """Held times as float64 seconds: exactly the floats written (caller holds the
        lock). The sum is taken in float64 in one step: uint32 plus an epoch below 2**53
        microseconds is a whole number float64 holds exactly, as the int64 sum was."""
        if self._micros is None:
            return held
        seconds = np.add(held, float(self._epoch[gpu]))
        seconds /= _MICRO
        return seconds

    def _time_at(self, gpu: int, slot: int) -> float:
        return float(self._decode(gpu, self.times[gpu, slot:slot + 1])[0])

    def _after(self, gpu: int, held: np.ndarray, t: float) -> int:
        """The index of the first held time later than t (held: one increasing run)."""
        if self._micros is None:
            return int(held.searchsorted(t, side="right"))
        if math.isnan(t) or t == math.inf:
            return len(held)
        if t == -math.inf:
            return 0
        epoch = self._epoch[gpu]
        q = math.floor(t * _MICRO) - epoch  # within a microsecond of the answer
        if q > _SPAN_US:
            return len(held)
        if q < -2:
            return 0
        while (epoch + q) / _MICRO > t:  # the least q decoded later than t, as decoded
            q -= 1
        q += 1
        while (epoch + q) / _MICRO <= t:
            q += 1
        if q <= 0:
            return 0
        if q >= _SPAN_US:
            return len(held)
        return int(held.searchsorted(np.uint32(q), side="left"))

    def _to_seconds(self) -> None:
        """Hold every time as float64 seconds from now on (caller holds the lock)."""
        micros = self._micros
        if micros is None:
            return
        seconds = np.zeros(self.milliwatts.shape)
        for gpu in range(self.gpus):
            for a, b in self._segments(gpu):
                seconds[gpu, a:b] = self._decode(gpu, micros[gpu, a:b])
        self._seconds, self._micros = seconds, None

    def _encode(self, gpu: int, times: np.ndarray, whole: np.ndarray | None = None
                ) -> np.ndarray | None:
        """New times as microseconds after the GPU's epoch (moved on when they no longer
        fit); None when they are not whole microseconds or cannot fit (caller holds the
        lock). `whole`: the whole microseconds times are exactly (times == whole / 1e6),
        where the caller has them (a drain's driver timestamps): not worked out again."""
        micros = self._micros
        if micros is None:
            return None
        if whole is not None:
            us = whole.astype(np.int64)
        else:
            if not np.isfinite(times).all():
                return None
            rounded = np.round(times * _MICRO)
            if np.abs(rounded).max() >= 2.0**53:
                return None
            us = rounded.astype(np.int64)
            if not np.array_equal(us / _MICRO, times):
                return None
        if not self.count[gpu]:
            self._epoch[gpu] = int(us[0])
        epoch = self._epoch[gpu]
        if int(us[-1]) - epoch >= _SPAN_US:  # move the epoch on to the oldest held
            if not self.count[gpu]:
                return None
            segments = self._segments(gpu)
            oldest = epoch + int(micros[gpu, segments[0][0]])
            if int(us[-1]) - oldest >= _SPAN_US:
                return None
            for a, b in segments:
                micros[gpu, a:b] -= np.uint32(oldest - epoch)
            self._epoch[gpu] = epoch = oldest
        return us - epoch

    def append(self, gpu: int, times: np.ndarray, watts: np.ndarray,
               micros: np.ndarray | None = None) -> None:
        """New samples of one GPU, oldest first. Any not newer than the GPU's newest are
        dropped (a wall clock stepped back under a polled GPU): the ring stays in time
        order, which window() relies on. `micros`, where the caller has them: the whole
        microseconds (below 2**53) that times are exactly (times == micros / 1e6)."""
        with self._lock:
            newest = self._newest[gpu]
        if len(times) and times[0] <= newest:
            keep = times > newest
            times, watts = times[keep], watts[keep]
            micros = None if micros is None else micros[keep]
        n = len(times)
        if n == 0:
            return
        if n > self.capacity:
            times, watts, skipped = times[-self.capacity:], watts[-self.capacity:], n
            micros = None if micros is None else micros[-self.capacity:]
            n = self.capacity
        else:
            skipped = n
        milliwatts = np.rint(watts * 1000.0)  # exact below 16.7 kW (np.round's rounding)
        with self._lock:
            held: np.ndarray = times
            if self._micros is not None:
                encoded = self._encode(gpu, times, micros)
                if encoded is None:
                    self._to_seconds()
                else:
                    held = encoded
            start = (self.count[gpu] + skipped - n) % self.capacity
            end = start + n
            if end <= self.capacity:  # most drains: one slice, no index array
                self.times[gpu, start:end] = held
                self.milliwatts[gpu, start:end] = milliwatts
            else:
                slots = np.arange(start, end) % self.capacity
                self.times[gpu, slots] = held
                self.milliwatts[gpu, slots] = milliwatts
            self.count[gpu] += skipped
            self._newest[gpu] = float(times[-1])

    def _segments(self, gpu: int) -> list[tuple[int, int]]:
        """One GPU's samples as physical slot ranges, oldest first: the ring is at most two
        runs of increasing times (caller holds the lock)."""
        n = min(self.count[gpu], self.capacity)
        head = (self.count[gpu] - n) % self.capacity  # the oldest sample's slot
        if head + n <= self.capacity:
            return [(head, head + n)]
        return [(head, self.capacity), (0, head + n - self.capacity)]

    def _runs(self, gpu: int, start: float, end: float) -> tuple[np.ndarray, np.ndarray]:
        """One GPU's samples with start < time <= end, oldest first, found by binary search
        (a short window costs no copy of the whole ring): float64 times (views of a
        float64 ring, copies only where the window crosses its end) and watts as new
        float64 arrays (caller holds the lock)."""
        times, watts = [], []
        # a window that ends at or after the GPU's newest sample takes each run to its
        # end (the usual case: the window ends at the newest sample of any GPU)
        whole = end >= self._newest[gpu]
        for a, b in self._segments(gpu):
            run = self.times[gpu, a:b]
            lo = self._after(gpu, run, start)
            hi = b - a if whole else self._after(gpu, run, end)
            if hi > lo:
                times.append(self._decode(gpu, run[lo:hi]))
                watts.append(np.divide(self.milliwatts[gpu, a + lo:a + hi], 1000.0,
                                       dtype=np.float64))  # float32 / 1000.0 stays float32
        if not times:
            return np.zeros(0), np.zeros(0)
        if len(times) == 1:
            return times[0], watts[0]
        return np.concatenate(times), np.concatenate(watts)

    def _between(self, gpu: int, start: float, end: float) -> tuple[np.ndarray, np.ndarray]:
        """Copies of one GPU's samples with start < time <= end, oldest first."""
        with self._lock:
            times, watts = self._runs(gpu, start, end)
            # watts: already a new array; times too unless read from float64 seconds
            return (times.copy() if self._micros is None else times), watts

    def _oldest(self, gpu: int) -> float:
        """The oldest sample the GPU still holds (caller holds the lock; count > 0)."""
        count = self.count[gpu]
        return self._time_at(gpu, (count - min(count, self.capacity)) % self.capacity)

    def _not_before_earliest(self, t: float) -> float:
        """max(t, the oldest sample any GPU still holds): t as soon as one GPU holds a
        sample at or before it (mostly the first GPU asked), without reading the others."""
        with self._lock:
            oldest = math.inf
            for gpu in range(self.gpus):
                if self.count[gpu]:
                    first = self._oldest(gpu)
                    if first <= t:
                        return t
                    oldest = min(oldest, first)
        return t if oldest == math.inf else max(t, oldest)

    def latest_time(self) -> float | None:
        """The newest sample of any GPU: the float each GPU's newest was written as (what
        its slot decodes to), without reading the ring."""
        with self._lock:
            ends = [self._newest[g] for g in range(self.gpus) if self.count[g]]
        return max(ends) if ends else None

    def window(self, gpu: int, seconds: float, end: float | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """One GPU's samples in (end - seconds, end], oldest first (end: its newest)."""
        if end is None:
            with self._lock:
                if not self.count[gpu]:
                    return np.zeros(0), np.zeros(0)
                end = self._time_at(gpu, (self.count[gpu] - 1) % self.capacity)
        return self._between(gpu, end - seconds, end)

    def grid(self, seconds: float, dt: float, end: float | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
        """Every GPU on one regular time grid over the last `seconds` (ending at the
        newest sample of any GPU): (times (n,), watts (gpus, n)), linearly interpolated;
        NaN where a GPU has no samples around a grid point (a gap, a lost GPU)."""
        end = self.latest_time() if end is None else end
        if end is None:
            return np.zeros(0), np.zeros((self.gpus, 0))
        start = self._not_before_earliest(end - seconds)  # no grid before the first sample
        grid = end - dt * np.arange(int((end - start) / dt), -1, -1)  # increasing
        out = np.full((self.gpus, len(grid)), np.nan)
        hole = max(4 * dt, 0.25)
        gridded, firsts, lasts = [], [], []
        with self._lock:  # read in place: no copies
            for gpu in range(self.gpus):
                times, watts = self._runs(gpu, end - (seconds + 2 * dt), end)
                if len(times) < 2:
                    continue
                out[gpu] = np.interp(grid, times, watts)
                gridded.append(gpu)
                firsts.append(times[0])
                lasts.append(times[-1])
                # no value across a hole: more than 4 grid steps (and 0.25 s) between
                # samples; the grid is sorted, so a hole is a slice found by binary search
                gaps = times[1:] - times[:-1]  # (np.diff costs more)
                if gaps.max() > hole:
                    for i in np.flatnonzero(gaps > hole):
                        a, b = grid.searchsorted(times[i:i + 2], side="right")
                        out[gpu, a:b] = np.nan  # times[i] < grid <= times[i + 1]
        # nor before a GPU's first sample (bar a step) or after its last (bar a hole): all
        # GPUs' bounds in two binary searches (this runs every second for the stall check)
        before = grid.searchsorted(np.array(firsts) - dt, side="left")
        after = grid.searchsorted(np.array(lasts) + hole, side="right")
        for gpu, i, j in zip(gridded, before, after, strict=True):
            out[gpu, :i] = np.nan
            out[gpu, j:] = np.nan
        return grid, out


class PowerRingView:
    """The power ring as one snapshot sees it: read-only, and ending at the newest sample
    when the snapshot was taken, so samples drained later never show in it. Each read
    copies what it returns under the ring's lock (PowerBuffer.window, .grid)."""

    def __init__(self, buffer: PowerBuffer):
        self._buffer = buffer
        self.end = buffer.latest_time()  # None: no sample yet
        self.span_seconds = buffer.span_seconds
        self.gpus = buffer.gpus

    def window(self, gpu: int, seconds: float) -> tuple[np.ndarray, np.ndarray]:
        """One GPU's samples in (end - seconds, end], oldest first."""
        if self.end is None:
            return np.zeros(0), np.zeros(0)
        return self._buffer.window(gpu, seconds, self.end)

    def grid(self, seconds: float, dt: float) -> tuple[np.ndarray, np.ndarray]:
        """Every GPU on one time grid over (end - seconds, end] (PowerBuffer.grid)."""
        if self.end is None:
            return np.zeros(0), np.zeros((self.gpus, 0))
        return self._buffer.grid(seconds, dt, self.end)


class SweepBuffer:
    """The sweep's values per GPU, one row a sweep, for window analyses (stragglers)."""

    FIELDS = ("sm_clock_hertz", "temperature_celsius", "utilization_gpu_ratio",
              "clock_event_reasons", "power_average_watts",
              "clock_event_sw_power_cap_seconds", "clock_event_sw_thermal_slowdown_seconds")

    def __init__(self, gpus: int, capacity: int):
        self.capacity = capacity
        self.times = np.full((gpus, capacity), np.nan)
        self.values = {name: np.full((gpus, capacity), np.nan) for name in self.FIELDS}
        # each row's time: its newest GPU time (-inf: none), so a window is chosen from
        # these alone (it is read every second)
        self.row_times = np.full(capacity, -np.inf)
        self.count = 0  # rows written
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return (self.times.nbytes + self.row_times.nbytes
                + sum(array.nbytes for array in self.values.values()))

    def append(self, rows: dict[int, tuple[float, dict[str, float | None]]]) -> None:
        """One row: for each GPU read this sweep, its time and values (missing: NaN)."""
        gpus = self.times.shape[0]
        with self._lock:
            slot = self.count % self.capacity
            self.times[:, slot] = np.nan
            for array in self.values.values():
                array[:, slot] = np.nan
            self.row_times[slot] = -np.inf
            for gpu, (t, values) in rows.items():
                if 0 <= gpu < gpus:
                    self.times[gpu, slot] = t
                    if math.isfinite(t) and t > self.row_times[slot]:
                        self.row_times[slot] = t
                    for name, array in self.values.items():
                        value = values.get(name)
                        if value is not None:
                            array[gpu, slot] = value
            self.count += 1

    def window(self, seconds: float, fields: Iterable[str] = FIELDS
               ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Copies of the last `seconds` of rows, oldest first: times and the values of
        `fields` (gpus x n)."""
        with self._lock:
            n = min(self.count, self.capacity)
            order = np.arange(self.count - n, self.count) % self.capacity
            row = self.row_times[order]
            newest = row.max() if n else -np.inf
            keep = order[row >= newest - seconds] if newest > -np.inf else order[:0]
            return self.times[:, keep], {name: self.values[name][:, keep] for name in fields}
