"""Live power analysis: the swing, cycle and ramp analysers run on the ring buffers.

Every `update_seconds` (default 5 s) the last `window_seconds` (default 30 s) of every
GPU's instant power go through analysis.power_swing.analyse_window, and the last
`segment_window_seconds` (default 120 s) through analysis.step_segments.find_step_swing
(the step swing inside the compute plateaus, the job's step rhythm); the slow scale
(analyse_cycles) runs on the last 10 minutes every minute; ramps are looked for in the
last minute. The samples come at the sensor's native rate, on one time grid; the band
they can show (0 to half their rate) comes with each update.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from exporter.analysis.bridging import Bridge, bridges_for, fill, holes_of
from exporter.analysis.power_swing import (
    CycleFeatures,
    NodeSwing,
    Ramp,
    SwingDetector,
    analyse_cycles,
    analyse_window,
    detect_ramps,
)
from exporter.analysis.step_segments import (
    SegmentAnalysis,
    StepSwing,
    find_step_swing,
    grid_relevant,
)
from exporter.sampling.settings import PowerSettings


@dataclass(frozen=True)
class PowerAnalysis:
    time: float
    window_seconds: float
    # the window swing: the node's over the last window_seconds (analyse_window); None
    # until the window holds enough samples
    window_swing: NodeSwing | None
    swinging: bool  # the held decision on the window swings (SwingDetector)
    cycle: CycleFeatures | None
    ramps_total: dict[str, int] = field(default_factory=dict)  # by direction
    last_ramp: Ramp | None = None  # time in Unix seconds
    duration_seconds: float = 0.0  # what the last update cost
    step: SegmentAnalysis | None = None  # the compute plateaus' step swing, when analysed
    step_grid_relevant: bool = False  # it passes min_amplitude_ratio and the band

    @property
    def step_swing(self) -> StepSwing | None:
        return self.step.swing if self.step is not None else None


class PowerMonitor:
    """Keeps the detector's state between updates; one instance per exporter."""

    def __init__(self, settings: PowerSettings):
        self.settings = settings
        self.band = (0.0, 0.0)  # what the samples can show: set by the sampler each update
        self.thresholds = settings.swing_thresholds()
        self.detector = SwingDetector(self.thresholds, settings.hold_updates)
        self.cycle: CycleFeatures | None = None
        self._last_cycle = -1e18
        self.step: SegmentAnalysis | None = None
        self._last_step = -1e18
        self.ramps_total = {"rise": 0, "fall": 0}
        self.last_ramp: Ramp | None = None
        # how far each analysis bridges a hole in the samples (a drain that came late, a
        # GPU that hung): the same rule as analyze's (analysis.bridging)
        self.bridges = bridges_for(settings)

    def cycle_due(self, now: float) -> bool:
        return now - self._last_cycle >= self.settings.cycle_every_seconds

    def step_due(self, now: float) -> bool:
        return now - self._last_step >= self.settings.step_every_seconds

    def short_seconds(self, now: float) -> float:
        """How much of the fine grid the next update reads (the segment window when due)."""
        s = self.settings
        short = max(s.window_seconds, s.ramp_window_seconds)
        return max(short, s.segment_window_seconds) if self.step_due(now) else short

    def update(self, times: np.ndarray, watts: np.ndarray, tdp: np.ndarray | None,
               now: float, band: tuple[float, float] | None = None,
               cycle_window: tuple[np.ndarray, np.ndarray] | None = None) -> PowerAnalysis:
        """times/watts: (gpus, n) on one time grid; band: the frequencies the samples can
        show (0 to half their rate). The slow cycles come from `cycle_window` (times,
        watts) when given (the long window on a coarser grid: minutes-long patterns need
        no 20 ms detail), else from times/watts when they reach back far enough."""
        if band is not None:
            self.band = band
        t0 = time.perf_counter()
        s = self.settings
        t_row = _row(times)
        swing = None
        recent = t_row >= (t_row[-1] - s.window_seconds) if t_row.size else t_row.astype(bool)
        power = None
        if recent.sum() >= 40 and np.isfinite(watts[:, recent]).any():
            power = _fill(t_row[recent], watts[:, recent], self.bridges["step"])
        if power is not None:
            swing = analyse_window(t_row[recent], power, tdp, s.band_hz,
                                   max_observable_hz=self.band[1],
                                   phase_grid_seconds=s.update_seconds,
                                   thresholds=self.thresholds)
        swinging = self.detector.update(swing) if swing is not None else False
        if swing is None:
            self.detector.reset()
        if cycle_window is not None:
            c_times, c_watts = cycle_window
            c_row = _row(c_times)
        else:
            c_row, c_watts = t_row, watts
        if c_row.size and self.cycle_due(now) and c_row[-1] - c_row[0] >= 2 * 10.0:
            self._last_cycle = now
            self.cycle = self._cycle(c_row, c_watts, tdp)
        self._count_ramps(t_row, watts, tdp)
        if self.step_due(now):
            self._last_step = now
            self.step = self._step(t_row, watts, tdp)
        step = self.step
        relevant = bool(step is not None and step.swing is not None and grid_relevant(
            step.swing, s.min_amplitude_ratio, s.band_hz))
        return PowerAnalysis(now, s.window_seconds, swing, swinging, self.cycle,
                             dict(self.ramps_total), self.last_ramp,
                             time.perf_counter() - t0, step, relevant)

    def _cycle(self, t_row: np.ndarray, watts: np.ndarray, tdp: np.ndarray | None
               ) -> CycleFeatures | None:
        """The slow cycle, its holes bridged as analyze bridges them: only measured samples
        folded, and no cycle faster than four times its longest hole."""
        b = self.bridges["cycle"]
        power = _fill(t_row, watts, b)
        if power is None:
            return None
        every = np.isfinite(watts[np.isfinite(watts).any(axis=1)]).all(axis=0)
        cycle = analyse_cycles(t_row, power, tdp, measured=every)
        longest = max((hi - lo for lo, hi in holes_of(t_row, every)), default=0.0)
        if cycle is not None and not b.bridges_at(cycle.period_seconds, longest):
            return None
        return cycle

    def _step(self, t_row: np.ndarray, watts: np.ndarray, tdp: np.ndarray | None
              ) -> SegmentAnalysis | None:
        """The step swing inside the compute plateaus of the last segment window."""
        s = self.settings
        if t_row.size < 40:
            return None
        recent = t_row >= t_row[-1] - s.segment_window_seconds
        rows = watts[:, recent]
        known = np.isfinite(rows).any(axis=1)
        if recent.sum() < 40 or not known.any():
            return None
        power = _fill(t_row[recent], rows[known], self.bridges["segments"])
        if power is None:
            return None
        return find_step_swing(t_row[recent], power,
                               None if tdp is None else np.asarray(tdp)[known],
                               observable_hz=self.band[1] or None, min_hz=s.band_hz[0],
                               phase_grid_seconds=s.update_seconds)

    def _count_ramps(self, t_row: np.ndarray, watts: np.ndarray, tdp: np.ndarray | None) -> None:
        s = self.settings
        if t_row.size < 40:
            return
        recent = t_row >= t_row[-1] - s.ramp_window_seconds
        rows = watts[:, recent]
        # The node's total only where every GPU with data in the window has a value: a GPU
        # drained later than the others (a starved exporter), or not yet sampled, would
        # otherwise count as 0 W and make a fall, then a rise, that never happened.
        rows = rows[np.isfinite(rows).any(axis=1)]
        known = np.isfinite(rows).all(axis=0)
        if known.sum() < 40:
            return
        t = t_row[recent]
        if not self.bridges["ramps"].window_ok(holes_of(t, known), float(t[0]), float(t[-1])):
            return  # an edge could hide in a hole longer than a ramp's bridge
        node = rows[:, known].sum(axis=0)
        total = float(np.nansum(tdp)) if tdp is not None else None
        for ramp in detect_ramps(t_row[recent][known], node, total,
                                 min_ratio=s.ramp_min_ratio):
            if self.last_ramp is not None and ramp.time <= self.last_ramp.time + 5.0:
                continue  # seen in an earlier update
            self.ramps_total[ramp.direction] += 1
            self.last_ramp = ramp


def _row(times: np.ndarray) -> np.ndarray:
    """The one time row of (gpus, n) times: their latest at each point (NaN-aware). Times
    broadcast from one grid (the sampler's: every row the same array) are that row, with
    no pass over every GPU's copy of it."""
    if not times.size:
        return np.zeros(0)
    if times.ndim == 2 and times.strides[0] == 0:
        return times[0].copy()
    return np.nanmax(times, axis=0)


def _fill(t: np.ndarray, watts: np.ndarray, b: Bridge) -> np.ndarray | None:
    """Holes (a failed read, a late drain, a hung GPU) bridged as the analysis' bridge
    says (a straight line across; None: a hole it cannot bridge, the window is left out);
    a GPU with no sample at all reads 0 W."""
    out = fill(t, watts, b)
    if out is not None:
        out[~np.isfinite(out)] = 0.0
    return out
