"""Feeds the live analyses from the buffers: power swings, cycles and ramps every few
seconds, stragglers and stalls every second (sampling/live_power.py, live_stragglers.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from exporter.analysis.signal import median
from exporter.sampling.buffers import SweepBuffer
from exporter.sampling.clock import Clock
from exporter.sampling.gpus import GpuSet
from exporter.sampling.live_goodput import GoodputAnalysis, GoodputMonitor
from exporter.sampling.live_power import PowerAnalysis, PowerMonitor
from exporter.sampling.live_stragglers import (
    StragglerAnalysis,
    StragglerMonitor,
)
from exporter.sampling.power_loop import PowerSampler
from exporter.sampling.settings import PowerSettings, StragglerSettings

# Finest and coarsest grids the analyses resample the native samples onto.
FINEST_GRID_SECONDS = 0.02
STRAGGLER_GRID_SECONDS = 0.1  # means and duty cycles over minutes need no more
CYCLE_GRID_SECONDS = 0.2  # checkpoint-scale cycles, over 10 minutes


def compute_rows(shares: dict | None, gpus: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A reading's compute shares (ProfilingReading.shares: GPU -> ((time, compute share),
    ...)) as (gpus, k) arrays of times and shares, NaN where a GPU has fewer entries; None
    without any."""
    if not shares:
        return None
    k = max(len(entries) for entries in shares.values())
    times, rows = np.full((gpus, k), np.nan), np.full((gpus, k), np.nan)
    for gpu, entries in shares.items():
        if 0 <= gpu < gpus and entries:
            times[gpu, :len(entries)], rows[gpu, :len(entries)] = zip(*entries, strict=True)
    return times, rows


class Analyses:
    def __init__(self, gpus: GpuSet, power: PowerSampler, clock: Clock,
                 power_settings: PowerSettings | None,
                 straggler_settings: StragglerSettings | None, sweep_interval: float,
                 job_groups: Callable[[], dict[int, str] | None],
                 compute_shares: Callable[[], dict | None] = lambda: None,
                 gpu_ranks: Callable[[], Mapping[int, int] | None] = lambda: None):
        self.gpus, self.power, self.clock = gpus, power, clock
        self.job_groups = job_groups
        self.compute_shares = compute_shares
        self.power_monitor = PowerMonitor(power_settings) if power_settings else None
        # the goodput account rides on the stall check's reads (no reads of its own), and
        # tells the stall check which of its stalls are a job's checkpoints
        self.goodput = GoodputMonitor(gpus.count, clock.time()) if straggler_settings else None
        self.straggler_monitor = (StragglerMonitor(dataclasses.replace(
            straggler_settings, sweep_interval_seconds=sweep_interval),
            judge=self.goodput.judge if self.goodput else None,
            checkpoint_within=self.goodput.ledger.checkpoint_within if self.goodput else None)
            if straggler_settings else None)
        self.sweep_buffer = (SweepBuffer(gpus.count, max(2, int(
            straggler_settings.window_seconds * 1.5 / sweep_interval)))
            if straggler_settings else None)
        self.power_analysis: PowerAnalysis | None = None
        self.straggler_analysis: StragglerAnalysis | None = None
        self.gpu_ranks = gpu_ranks
        self.goodput_analysis: GoodputAnalysis | None = None
        # who held each GPU and its ranks when the stall check last read (the account's)
        self._holders: tuple[dict[int, str] | None, Mapping[int, int] | None] = (None, None)
        self._tdp_of: tuple[tuple, np.ndarray | None] | None = None  # (identities, _tdp())

    def _grid_step(self) -> float:
        intervals = [i for g in range(self.gpus.count) if (i := self.power.interval(g))]
        return max(FINEST_GRID_SECONDS, float(median(intervals)) if intervals else 0.05)

    def _tdp(self) -> np.ndarray | None:
        """Each GPU's default power limit (None unless every GPU's is known): made again
        only when an identity changed (it is asked every second; the array is read, never
        written, by the analyses)."""
        identities = tuple(self.gpus.identities)
        if self._tdp_of is not None and self._tdp_of[0] == identities:
            return self._tdp_of[1]
        limits = [i.default_power_limit_watts if i is not None else None for i in identities]
        tdp = None if any(v is None for v in limits) else np.array(limits, dtype=float)
        if tdp is not None:
            tdp.flags.writeable = False  # shared by every tick until an identity changes
        self._tdp_of = (identities, tdp)
        return tdp

    def power_tick(self) -> None:
        monitor, buffer = self.power_monitor, self.power.buffer
        if monitor is None or buffer is None:
            return
        now, s = self.clock.time(), monitor.settings
        grid, watts = buffer.grid(monitor.short_seconds(now), self._grid_step())
        cycle = None
        if monitor.cycle_due(now):
            c_grid, c_watts = buffer.grid(s.cycle_window_seconds, CYCLE_GRID_SECONDS)
            cycle = (np.broadcast_to(c_grid, c_watts.shape), c_watts)
        self.power_analysis = monitor.update(np.broadcast_to(grid, watts.shape), watts,
                                             self._tdp(), now, self.power.band(), cycle)

    def straggler_tick(self) -> None:
        monitor, buffer, sweep = self.straggler_monitor, self.power.buffer, self.sweep_buffer
        if monitor is None or buffer is None or sweep is None:
            return
        now, groups = self.clock.time(), self.job_groups()
        self.straggler_analysis = monitor.update(
            now, lambda seconds: buffer.grid(seconds, STRAGGLER_GRID_SECONDS),
            lambda fields: sweep.window(monitor.settings.window_seconds, fields),
            groups, lambda: compute_rows(self.compute_shares(), self.gpus.count))
        self._holders = (groups, self.gpu_ranks() if self.goodput is not None else None)

    def goodput_tick(self, now: float, failed: Iterable[int]) -> GoodputAnalysis | None:
        """The goodput account's time since its last tick, settled at publishing with the
        GPUs the published verdict fails (`failed`, the lost ones among them): a GPU the
        verdict fails counts failed in the very snapshot that carries that verdict. It
        rides on the stall check's last reads, and waits for the first of them (the time
        before goes to the state they show, as the account always did)."""
        monitor, analysis = self.straggler_monitor, self.straggler_analysis
        if self.goodput is None or monitor is None or analysis is None:
            return self.goodput_analysis
        groups, ranks = self._holders
        self.goodput_analysis = self.goodput.update(
            now, monitor.means, monitor.floor, monitor.level, analysis.stall, failed,
            groups, self._tdp(), ranks)
        return self.goodput_analysis
