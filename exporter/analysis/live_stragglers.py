"""Live straggler and stall analysis on the ring buffers (analysis/straggler.py).

Every second the stall check looks at the last 2 s (each GPU's mean utilization and
power against its compute level over the last 2 minutes); every 10 s the straggler
detector compares each GPU's features over the last 60 s with its peers' (the GPUs of the
same job where the job mapping says so), and holds findings for the persistence
(default 5 minutes).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from exporter.analysis.stalls import StallResult, compute_level, detect_stall
from exporter.analysis.straggler import (
    StragglerDetector,
    StragglerReport,
    StragglerThresholds,
    WindowFeatures,
    window_features,
)


@dataclass(frozen=True)
class StragglerSettings:
    window_seconds: float = 60.0
    update_seconds: float = 10.0
    persistence_seconds: float = 300.0
    stall_window_seconds: float = 2.0
    stall_context_seconds: float = 120.0


@dataclass(frozen=True)
class StragglerAnalysis:
    time: float
    features: WindowFeatures | None
    report: StragglerReport | None
    stall: StallResult | None
    stalls_total: int = 0
    stall_seconds_total: float = 0.0
    culprit_seconds: dict[int, float] = field(default_factory=dict)  # by GPU
    duration_seconds: float = 0.0


class StragglerMonitor:
    def __init__(self, settings: StragglerSettings):
        self.settings = settings
        self.detector = StragglerDetector(StragglerThresholds(
            persistence_seconds=settings.persistence_seconds))
        self.features: WindowFeatures | None = None
        self.report: StragglerReport | None = None
        self._last_update = -1e18
        self.stalled = False
        self.stalls_total = 0
        self.stall_seconds = 0.0
        self.culprit_seconds: dict[int, float] = {}
        self._last_stall_check: float | None = None

    def update(self, now: float, power_t: np.ndarray, power: np.ndarray,
               sweep_t: np.ndarray, sweep: dict[str, np.ndarray],
               groups: dict[int, str] | None,
               compute: tuple[np.ndarray, np.ndarray] | None = None) -> StragglerAnalysis:
        """power_t/power: (gpus, n) at the power rate over the stall context; sweep_t and
        each sweep[...]: (gpus, m) at the sweep rate over the straggler window; compute:
        (times, shares) of each GPU's recent profiling intervals, (gpus, k) (end times)."""
        t0 = time.perf_counter()
        s = self.settings
        gpus = list(range(power.shape[0]))
        t_row = np.nanmax(power_t, axis=0) if power_t.size else np.zeros(0)
        stall = None
        if t_row.size >= 10:
            stall = self._check_stall(now, t_row, power, sweep_t, sweep, gpus, groups)
        if now - self._last_update >= s.update_seconds and t_row.size >= 10:
            self._last_update = now
            recent = t_row >= t_row[-1] - s.window_seconds
            series = {}
            for name, key in (("sm_clock", "sm_clock_hertz"),
                              ("temperature", "temperature_celsius"),
                              ("utilization", "utilization_gpu_ratio"),
                              ("clock_event_reasons", "clock_event_reasons")):
                if key in sweep and sweep_t.size:
                    series[name] = (np.nanmax(sweep_t, axis=0), sweep[key])
            if compute is not None:  # the intervals that end within the window
                times, shares = compute
                with np.errstate(invalid="ignore"):
                    inside = times >= t_row[-1] - s.window_seconds
                series["compute"] = (times, np.where(inside, shares, np.nan))
            self.features = window_features(t_row[recent], power[:, recent], gpus=gpus,
                                            **series)
            self.report = self.detector.update(self.features, t=now, groups=groups)
        return StragglerAnalysis(now, self.features, self.report, stall, self.stalls_total,
                                 self.stall_seconds, dict(self.culprit_seconds),
                                 time.perf_counter() - t0)

    def _check_stall(self, now: float, t_row: np.ndarray, power: np.ndarray,
                     sweep_t: np.ndarray, sweep: dict[str, np.ndarray], gpus: list[int],
                     groups: dict[int, str] | None) -> StallResult | None:
        s = self.settings
        util = sweep.get("utilization_gpu_ratio")
        if util is None or not sweep_t.size:
            return None
        short = t_row >= t_row[-1] - s.stall_window_seconds
        sweep_row = np.nanmax(sweep_t, axis=0)
        short_sweep = sweep_row >= sweep_row[-1] - s.stall_window_seconds
        with warnings.catch_warnings():  # a GPU with no sample in 2 s (lost) gives NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            mean_power = np.nanmean(power[:, short], axis=1)
            mean_util = np.nanmean(util[:, short_sweep], axis=1)
        level = compute_level(power)
        stall = detect_stall(mean_util, mean_power, level, gpus=gpus, groups=groups)
        elapsed = 0.0 if self._last_stall_check is None else min(now - self._last_stall_check,
                                                                   5.0)
        self._last_stall_check = now
        if stall.stalled:
            if not self.stalled:
                self.stalls_total += 1
            self.stall_seconds += elapsed
            for gpu in stall.culprit_gpus:
                self.culprit_seconds[gpu] = self.culprit_seconds.get(gpu, 0.0) + elapsed
        self.stalled = stall.stalled
        return stall
