"""Live straggler and stall analysis on the ring buffers (analysis/straggler.py).

Every second the stall check looks at the last 2 s (each GPU's mean utilization and
power against its compute level, the level taken over the last 2 minutes every 10 s);
every 10 s the straggler detector compares each GPU's features over the last 60 s with
its peers' (the GPUs of the same job where the job mapping says so): a signal that has
deviated for the persistence (default 5 minutes) is an outlier.

A window the exporter did not sample well is not analysed: when power samples are
missing for longer than the straggler window bridges (analysis.bridging: a tenth of the
window; the driver's buffer overflowed before a drain, the exporter was starved, or a
GPU hung), or sweeps were skipped (its loop overran), the update is held: outliers stay
as they were, no window features are exported, and `gpu_node_straggler_analysis_held`
says so. Shorter holes are bridged by a straight line, as `analyze` bridges them. The
exporter's own trouble never becomes an outlier or a stall of the GPUs. The stall check compares
the GPUs only at instants at which all of them have power, and holds its answer through
a hole up to the stall bridge (6 s by default) when no such instant is left.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exporter.analysis.bridging import bridges_for, fill
from exporter.analysis.goodput import FLOOR_PERCENTILE
from exporter.analysis.stalls import StallResult, compute_level, detect_stall
from exporter.analysis.straggler import (
    COUNTED_REASONS,
    StragglerDetector,
    StragglerReport,
    WindowFeatures,
    window_features,
)
from exporter.sampling.settings import StragglerSettings

# The least share of the expected sweeps that must come for a window to be analysed
# (power: the straggler window's bridge decides, analysis.bridging).
MIN_SWEEP_COVERAGE = 0.8

# (seconds) -> (times (n,), power (gpus, n)) of the last `seconds` on one grid
PowerWindow = Callable[[float], tuple[np.ndarray, np.ndarray]]
# (fields) -> (times (gpus, m), {field: values (gpus, m)}) of the sweeps over the window
SweepWindow = Callable[[Sequence[str]], tuple[np.ndarray, dict[str, np.ndarray]]]
# (times, shares) of each GPU's recent profiling intervals, (gpus, k), or None
ComputeRows = Callable[[], tuple[np.ndarray, np.ndarray] | None]

# The sweep fields the window features use (name in window_features, sweep field); the
# stall check needs only the utilization, and that is all it reads on most seconds.
FEATURE_SWEEPS = (("sm_clock", "sm_clock_hertz"), ("temperature", "temperature_celsius"),
                  ("utilization", "utilization_gpu_ratio"),
                  ("clock_event_reasons", "clock_event_reasons"))
# the driver's violation counters the sweep reads, by reason (straggler.COUNTED_REASONS)
THROTTLE_COUNTERS = {reason: f"clock_event_{reason}_seconds" for reason in COUNTED_REASONS}
STALL_SWEEP = "utilization_gpu_ratio"


@dataclass(frozen=True)
class StragglerAnalysis:
    time: float
    features: WindowFeatures | None  # None while held (or before the first window)
    report: StragglerReport | None
    stall: StallResult | None
    stalls_total: int = 0
    stall_seconds_total: float = 0.0
    culprit_seconds: dict[int, float] = field(default_factory=dict)  # by GPU
    duration_seconds: float = 0.0
    held: bool = False  # the last window was not analysed: the exporter sampled it badly
    coverage: dict[str, float] = field(default_factory=dict)  # "power", "sweep": 0-1


def nan_row_means(a: np.ndarray) -> np.ndarray:
    """np.nanmean(a, axis=1), the same values, without its warning machinery (NaN for a
    row without values: a GPU with no sample in the window, lost)."""
    nan = np.isnan(a)
    if a.shape[1] and not nan.any():
        return a.mean(axis=1)
    ok = ~nan
    count = ok.sum(axis=1)
    out = np.full(a.shape[0], np.nan)
    np.divide(np.where(ok, a, 0.0).sum(axis=1), count, out=out, where=count > 0)
    return out


def coverage(power: np.ndarray, sweep_t: np.ndarray, sweep_interval: float
             ) -> dict[str, float]:
    """How well the window was sampled, from each series' first sample on (a window not
    yet full after start is not a gap): the worst GPU's share of grid points with power,
    and the share of the sweeps expected over the sweeps' span that came. GPUs with no
    data at all (lost, hung) are reported apart (gpu_up) and do not count here."""
    power_share = 1.0
    for row in np.isfinite(power):
        if row.any():
            power_share = min(power_share, float(row[int(np.argmax(row)):].mean()))
    sweep_share = 1.0
    if sweep_t.size:
        rows = np.sort(np.nanmax(np.where(np.isfinite(sweep_t), sweep_t, -np.inf), axis=0))
        rows = rows[np.isfinite(rows)]
        span = rows[-1] - rows[0] if len(rows) else 0.0
        if span >= 3 * sweep_interval:
            sweep_share = min(1.0, (len(rows) - 1) / (span / sweep_interval))
    return {"power": power_share, "sweep": sweep_share}


# (stall, groups) -> the stall, or the same signature said to be a job's checkpoint
StallJudge = Callable[[StallResult, dict[int, str] | None], StallResult]


class StragglerMonitor:
    def __init__(self, settings: StragglerSettings, judge: StallJudge | None = None,
                 checkpoint_within: Callable[[float], bool] | None = None):
        """`judge`: the goodput account's word on each stall (a checkpoint is none);
        `checkpoint_within(seconds)`: whether a job checkpointed in the last `seconds` (a
        window that holds a checkpoint updates no outlier: rank 0, writing,
        differs from its peers by design)."""
        self.settings = settings
        self.judge = judge
        self.checkpoint_within = checkpoint_within
        self.detector = StragglerDetector(settings.thresholds())
        self.features: WindowFeatures | None = None
        self.report: StragglerReport | None = None
        self.held = False
        self.coverage: dict[str, float] = {}
        self._level: np.ndarray | None = None  # each GPU's compute level, for the stall check
        self.floor: np.ndarray | None = None  # and its power near idle (the goodput account)
        # the last stall check's means over its window: power (W) and utilization (NaN
        # where not read), by GPU
        self.means: tuple[np.ndarray, np.ndarray] | None = None
        self._last_update = -1e18
        self.stalled = False
        self.stalls_total = 0
        self.stall_seconds = 0.0
        self.culprit_seconds: dict[int, float] = {}
        self._last_stall_check: float | None = None
        self._last_stall: StallResult | None = None
        self._blind_since: float | None = None  # no instant with every GPU's power since
        self.bridges = bridges_for(stragglers=settings)

    @property
    def level(self) -> np.ndarray | None:
        """Each GPU's compute level (the stall check's), once known."""
        return self._level

    def update(self, now: float, power_window: PowerWindow, sweep_window: SweepWindow,
               groups: dict[int, str] | None, compute: ComputeRows = lambda: None
               ) -> StragglerAnalysis:
        """Power and sweeps come from `power_window` and `sweep_window` (the sweeps at
        their rate over the straggler window), asked only for what is due: most seconds
        that is the stall window's power and the utilization; compute: (times, shares) of
        each GPU's recent profiling intervals, (gpus, k) (end times)."""
        t0 = time.perf_counter()
        s = self.settings
        self.means = None
        sweeps: tuple[np.ndarray, dict[str, np.ndarray]] | None = None
        if now - self._last_update >= s.update_seconds:
            t_row, power = power_window(max(s.stall_context_seconds, s.window_seconds))
            if t_row.size >= 10:
                self._last_update = now
                self._level = compute_level(power)
                self.floor = compute_level(power, FLOOR_PERCENTILE)
                sweeps = sweep_window([key for _, key in FEATURE_SWEEPS]
                                      + list(THROTTLE_COUNTERS.values()))
                self._update_features(now, t_row, power, *sweeps, groups, compute())
        stall = None
        if self._level is not None:
            t_row, power = power_window(s.stall_window_seconds)
            if t_row.size:
                stall = self._check_stall(now, power, *(sweeps or sweep_window([STALL_SWEEP])),
                                          groups)
        return StragglerAnalysis(now, None if self.held else self.features, self.report, stall,
                                 self.stalls_total, self.stall_seconds,
                                 dict(self.culprit_seconds), time.perf_counter() - t0,
                                 self.held, dict(self.coverage))

    def _update_features(self, now: float, t_row: np.ndarray, power: np.ndarray,
                         sweep_t: np.ndarray, sweep: dict[str, np.ndarray],
                         groups: dict[int, str] | None,
                         compute: tuple[np.ndarray, np.ndarray] | None) -> None:
        s = self.settings
        recent = t_row >= t_row[-1] - s.window_seconds
        self.coverage = coverage(power[:, recent], sweep_t, s.sweep_interval_seconds)
        bridged = fill(t_row[recent], power[:, recent], self.bridges["outliers"],
                       hold_edges=False)
        self.held = bridged is None or self.coverage["sweep"] < MIN_SWEEP_COVERAGE
        if bridged is None or self.held:
            return  # outliers stay as they were; no features from a badly sampled window
        series: dict[str, Any] = {}  # window_features' keyword arguments, by name
        if sweep_t.size:
            sweep_row = np.nanmax(sweep_t, axis=0)
            for name, key in FEATURE_SWEEPS:
                if key in sweep:
                    series[name] = (sweep_row, sweep[key])
            series["throttle_seconds"] = {reason: (sweep_row, sweep[key])
                                          for reason, key in THROTTLE_COUNTERS.items()
                                          if key in sweep}
        if compute is not None:  # the profiling intervals that end within the window
            times, shares = compute
            with np.errstate(invalid="ignore"):
                inside = times >= t_row[-1] - s.window_seconds
            series["compute"] = (times, np.where(inside, shares, np.nan))
        gpus = list(range(power.shape[0]))
        self.features = window_features(t_row[recent], bridged, gpus=gpus, **series)
        if self.checkpoint_within is not None and self.checkpoint_within(s.window_seconds):
            return  # outliers stay as they were over a window that holds a checkpoint
        self.report = self.detector.update(self.features, t=now, groups=groups)

    def _check_stall(self, now: float, power: np.ndarray, sweep_t: np.ndarray,
                     sweep: dict[str, np.ndarray], groups: dict[int, str] | None
                     ) -> StallResult | None:
        s = self.settings
        mean_power = nan_row_means(power)  # NaN for a GPU with no sample in 2 s (lost)
        util = sweep.get(STALL_SWEEP)
        if util is None or not sweep_t.size:
            self.means = (mean_power, np.full(mean_power.shape, np.nan))
            return None
        sweep_row = np.nanmax(sweep_t, axis=0)
        short_sweep = sweep_row >= sweep_row[-1] - s.stall_window_seconds
        # only the instants at which every GPU with power in the window has it: GPUs
        # compared over different instants of a swing would make a stall of their own
        sampled = np.isfinite(power)
        common = sampled[sampled.any(axis=1)].all(axis=0)
        elapsed = 0.0 if self._last_stall_check is None else min(now - self._last_stall_check,
                                                                   5.0)
        self._last_stall_check = now
        if sampled.any() and not common.any():  # a hole: hold the verdict through it
            self._blind_since = self._blind_since if self._blind_since is not None else now
            if now - self._blind_since <= self.bridges["stalls"].limit_seconds:
                if self.stalled and self._last_stall is not None:
                    self._count_stall(self._last_stall, elapsed, new=False)
                return self._last_stall
        else:
            self._blind_since = None
        mean_power = nan_row_means(power[:, common])  # NaN for a GPU with none (lost)
        mean_util = nan_row_means(util[:, short_sweep])
        self.means = (mean_power, mean_util)
        gpus = list(range(power.shape[0]))
        assert self._level is not None  # only checked once the level is known
        stall = detect_stall(mean_util, mean_power, self._level, gpus=gpus, groups=groups)
        if self.judge is not None:
            stall = self.judge(stall, groups)
        if stall.stalled:
            self._count_stall(stall, elapsed, new=not self.stalled)
        self.stalled = stall.stalled
        self._last_stall = stall
        return stall

    def _count_stall(self, stall: StallResult, elapsed: float, new: bool) -> None:
        if new:
            self.stalls_total += 1
        self.stall_seconds += elapsed
        for gpu in stall.culprit_gpus:
            self.culprit_seconds[gpu] = self.culprit_seconds.get(gpu, 0.0) + elapsed
