"""Stragglers and stalls: each GPU against its peers, as pure numpy.

Two questions, two time scales (see docs/stragglers.md):

- **stragglers** (:func:`window_features` over ~60 s, then
  :class:`StragglerDetector`): per GPU, the window's mean SM clock, power,
  temperature, utilization, compute duty cycle, throttled share and (where
  given) NVLink/PCIe throughput and compute share (the busiest math pipe's share
  of the time, from GPM: the straggler computes while its peers spin), each
  compared with the GPU's peers (the node, or the GPUs of the same job) by a
  modified z-score
  ``M = 0.6745 (x - median) / MAD`` with a floor on the MAD, an effect-size
  gate and a persistence requirement;
- **stalls** (:func:`detect_stall` over a few seconds): most GPUs of a group
  busy-wait (utilization high, power far below their own compute level) while
  one or a few look different (idle, or still computing at high power): those
  are the likely culprits.

:mod:`exporter.analysis.stalls` has the stall check, and
:mod:`exporter.analysis.straggler_scan` slides both over whole series (the offline
``analyze``).
Inputs are plain numpy arrays: times ``t`` (M,) and per-GPU series (N, M),
NaN where a sample is missing.  Nothing here knows about NVML, HTTP or
Prometheus.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from exporter.analysis.signal import percentile
from exporter.gpu.fields import CLOCK_EVENT_REASONS

SIGNALS: tuple[str, ...] = (
    "sm_clock", "power", "temperature", "utilization", "duty_cycle", "throttle", "nvlink", "pcie",
    "compute",
)
LOW, HIGH = "low", "high"

# clock event ("throttle") reasons counted as throttling, under the names the metrics
# use; the other bits (GPU idle, applications clocks setting, sync boost, display clock)
# are not a slowdown of a busy GPU.
THROTTLE_REASONS: dict[str, int] = {
    name: bit for name, bit in CLOCK_EVENT_REASONS.items()
    if name in ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                "hw_power_brake_slowdown")}
THROTTLE_MASK = sum(THROTTLE_REASONS.values())
# The reasons the driver also counts in time at the sweep's rate (violation counters,
# `clock_event_<reason>_seconds`): where those are given, their share of the window is
# read from the counters, which integrate time exactly; bits sampled once a sweep alias
# with a load whose period divides the sweep's (a 2 s step read at 1 Hz).
COUNTED_REASONS = ("sw_power_cap", "sw_thermal_slowdown")
UNCOUNTED_MASK = THROTTLE_MASK & ~sum(THROTTLE_REASONS[r] for r in COUNTED_REASONS)

MAD_SCALE = 0.6745  # MAD of a normal distribution / its standard deviation

# Absolute floor on the MAD, in each signal's unit (Hz, W, degC, ratio, B/s):
# with MAD = 0 and median = 0 the score stays finite.
DEFAULT_MAD_EPSILON: dict[str, float] = {
    "sm_clock": 1e6, "power": 0.5, "temperature": 0.5, "utilization": 0.005,
    "duty_cycle": 0.005, "throttle": 0.005, "nvlink": 1e6, "pcie": 1e6, "compute": 0.005,
}
# Smallest difference from the median that counts, whatever the median (the
# relative gate alone means nothing near a median of 0): power 10 W is twice
# nvidia-smi's stated +/-5 W accuracy; ratios 0.1 (0.05 for the duty cycle and the
# compute share, which a straggler raises by its extra compute time times the pipe's
# load: 0.077 for a GPU 15 % slower at a 0.65 duty cycle).
DEFAULT_MIN_ABS_EFFECT: dict[str, float] = {
    "sm_clock": 0.0, "power": 10.0, "temperature": 3.0, "utilization": 0.10,
    "duty_cycle": 0.05, "throttle": 0.10, "nvlink": 1e8, "pcie": 1e8, "compute": 0.05,
}

Series = np.ndarray | tuple[np.ndarray, np.ndarray]
"""An (N, M) array sampled at the window's ``t``, or ``(times, values)`` with
its own sample times (e.g. clocks at 1 Hz next to power at 20 Hz)."""


# --------------------------------------------------------------------------- features


@dataclass(frozen=True)
class GpuFeatures:
    """One GPU over one window; NaN where the input was not given or had no data."""

    gpu: int
    sm_clock_hertz: float
    power_watts: float
    temperature_celsius: float
    utilization_ratio: float
    duty_cycle: float  # share of the window above the node's (p5 + p95) / 2 power
    throttle_ratio: float  # share of the window throttled (see window_features)
    throttle_reasons: Mapping[str, float]  # reason -> share of the window (empty if not given)
    nvlink_bytes_per_second: float
    pcie_bytes_per_second: float
    compute_ratio: float = math.nan  # busiest math pipe's share of the time (GPM)

    def value(self, signal: str) -> float:
        return getattr(self, _SIGNAL_FIELDS[signal])


_SIGNAL_FIELDS = {
    "sm_clock": "sm_clock_hertz",
    "power": "power_watts",
    "temperature": "temperature_celsius",
    "utilization": "utilization_ratio",
    "duty_cycle": "duty_cycle",
    "throttle": "throttle_ratio",
    "nvlink": "nvlink_bytes_per_second",
    "pcie": "pcie_bytes_per_second",
    "compute": "compute_ratio",
}


@dataclass(frozen=True)
class WindowFeatures:
    """Result of :func:`window_features`: every GPU of a node over one window."""

    t_start: float
    t_end: float
    gpus: dict[int, GpuFeatures]
    node_power_p5_watts: float
    node_power_p95_watts: float
    phases: bool  # the node's power has distinct compute and wait phases (duty cycle defined)

    def matrix(self, signals: Sequence[str] = SIGNALS) -> tuple[list[int], np.ndarray]:
        """(GPU ids, (len(signals), N) values)."""
        ids = list(self.gpus)
        m = np.array([[self.gpus[g].value(s) for g in ids] for s in signals], dtype=np.float64)
        return ids, m.reshape(len(signals), len(ids))


def _rows(x: Series | None, n: int, name: str) -> np.ndarray | None:
    if x is None:
        return None
    values = x[1] if isinstance(x, tuple) else x
    a = np.asarray(values, dtype=np.float64)
    a = a.reshape(1, -1) if a.ndim == 1 and n == 1 else a
    if a.ndim != 2 or a.shape[0] != n:
        raise ValueError(f"{name}: expected {n} rows (one per GPU), got shape {a.shape}")
    return a


def _counter_shares(x: Series | None, t: np.ndarray, n: int) -> np.ndarray:
    """Per GPU, a cumulative seconds counter's increase between its first and last
    readings over the time between them, at most 1; NaN with fewer than two readings or
    a counter that went back between two of them (a reset)."""
    out = np.full(n, np.nan)
    values = _rows(x, n, "throttle_seconds")
    if values is None:
        return out
    times = np.asarray(x[0] if isinstance(x, tuple) else t, dtype=np.float64)
    for i in range(n):
        ok = np.isfinite(values[i]) & np.isfinite(times)
        tt, vv = times[ok], values[i][ok]
        if tt.size >= 2 and tt[-1] > tt[0] and not (np.diff(vv) < 0).any():
            out[i] = min(1.0, (vv[-1] - vv[0]) / (tt[-1] - tt[0]))
    return out


def _throttle(reasons_rows: np.ndarray | None, counters: Mapping[str, np.ndarray], n: int
              ) -> tuple[np.ndarray, list[dict[str, float]]]:
    """The throttled share per GPU (see window_features) and each reason's share of the
    window: from the driver's counter where `counters` (reason -> share per GPU) has it,
    else of the sweeps (bits)."""
    # the counters do not say whether their reasons held at the same time: their sum (and
    # the bits of the others added to it) is an upper bound, capped at the whole window
    counted = (np.asarray(sum(counters[r] for r in COUNTED_REASONS))
               if all(r in counters for r in COUNTED_REASONS) else np.full(n, np.nan))
    thr = counted.copy()
    per_reason: list[dict[str, float]] = [{} for _ in range(n)]
    if reasons_rows is not None and reasons_rows.shape[1]:
        ok = np.isfinite(reasons_rows)
        bits = np.where(ok, reasons_rows, 0).astype(np.int64)
        cnt = ok.sum(axis=1)
        has = cnt > 0
        denom = np.maximum(cnt, 1)
        sampled = np.where(has, ((bits & THROTTLE_MASK) != 0).sum(axis=1) / denom, np.nan)
        others = ((bits & UNCOUNTED_MASK) != 0).sum(axis=1) / denom
        thr = np.where(np.isfinite(counted) & has, np.minimum(1.0, counted + others), sampled)
        for name, bit in THROTTLE_REASONS.items():
            share = ((bits & bit) != 0).sum(axis=1) / denom
            exact = counters.get(name)
            for i in range(n):
                if has[i]:
                    per_reason[i][name] = float(
                        exact[i] if exact is not None and np.isfinite(exact[i]) else share[i])
    return thr, per_reason


def _row_means(a: np.ndarray | None, n: int) -> np.ndarray:
    if a is None or a.shape[1] == 0:
        return np.full(n, np.nan)
    ok = np.isfinite(a)
    cnt = ok.sum(axis=1)
    s = np.where(ok, a, 0.0).sum(axis=1)
    out = np.full(n, np.nan)
    np.divide(s, cnt, out=out, where=cnt > 0)
    return out


def window_features(
    t: np.ndarray,
    power: np.ndarray,
    *,
    gpus: Sequence[int] | None = None,
    sm_clock: Series | None = None,
    temperature: Series | None = None,
    utilization: Series | None = None,
    clock_event_reasons: Series | None = None,
    nvlink: Series | None = None,
    pcie: Series | None = None,
    compute: Series | None = None,
    throttle_seconds: Mapping[str, Series] | None = None,
    min_phase_contrast: float = 0.25,
) -> WindowFeatures:
    """Per-GPU features of a node over one window.

    ``t``: (M,) sample times of ``power`` (seconds).  ``power``: (N, M) watts.
    The optional series are (N, M') in their base units (Hz, degC, ratio 0-1,
    bitmask, bytes/s), on ``t`` or as ``(times, values)``; ``compute`` is the compute
    share (0-1) of intervals within the window (GPM readings, every ~10 s);
    ``throttle_seconds`` the driver's seconds so far (cumulative) by reason, for
    COUNTED_REASONS.

    The throttled share is that of the samples of ``clock_event_reasons`` with a
    throttling bit; where every counter in ``throttle_seconds`` has two readings, the
    counted reasons' share is their increase over their span instead, plus the sampled
    share of the others. Each counted reason's own share (``throttle_reasons``) comes
    from its counter the same way.

    The duty cycle is the share of a GPU's power samples above the midpoint of
    the node's pooled p5 and p95 power; it is NaN (not compared) unless the node
    has phases: p95 - p5 >= ``min_phase_contrast`` * p95.  Without that guard a
    flat node's midpoint splits the GPUs by their static offsets.
    """
    t = np.asarray(t, dtype=np.float64)
    p = np.atleast_2d(np.asarray(power, dtype=np.float64))
    if t.ndim != 1 or p.shape[1] != t.size:
        raise ValueError(f"power has {p.shape[1]} samples per GPU, t has {t.size}")
    n = p.shape[0]
    ids = [int(g) for g in gpus] if gpus is not None else list(range(n))
    if len(ids) != n:
        raise ValueError("gpus must name every row of power")
    fin = p[np.isfinite(p)]
    if fin.size:
        p5, p95 = (float(v) for v in percentile(fin, [5, 95]))
    else:
        p5 = p95 = math.nan
    phases = bool(fin.size and p95 > 0 and p95 - p5 >= min_phase_contrast * p95)
    if phases:
        mid = (p5 + p95) / 2
        with np.errstate(invalid="ignore"):
            duty = _row_means(np.where(np.isfinite(p), (p > mid).astype(float), np.nan), n)
    else:
        duty = np.full(n, np.nan)
    pw = _row_means(p, n)
    clk = _row_means(_rows(sm_clock, n, "sm_clock"), n)
    temp = _row_means(_rows(temperature, n, "temperature"), n)
    util = _row_means(_rows(utilization, n, "utilization"), n)
    nvl = _row_means(_rows(nvlink, n, "nvlink"), n)
    pci = _row_means(_rows(pcie, n, "pcie"), n)
    comp = _row_means(_rows(compute, n, "compute"), n)
    counters = {reason: _counter_shares(series, t, n)
                for reason, series in (throttle_seconds or {}).items()}
    thr, per_reason = _throttle(_rows(clock_event_reasons, n, "clock_event_reasons"),
                                counters, n)
    feats = {
        g: GpuFeatures(g, float(clk[i]), float(pw[i]), float(temp[i]), float(util[i]),
                       float(duty[i]), float(thr[i]), per_reason[i], float(nvl[i]),
                       float(pci[i]), float(comp[i]))
        for i, g in enumerate(ids)
    }
    t0 = float(t[0]) if t.size else math.nan
    t1 = float(t[-1]) if t.size else math.nan
    return WindowFeatures(t0, t1, feats, p5, p95, phases)


# --------------------------------------------------------------------------- peer statistics


@dataclass(frozen=True)
class StragglerThresholds:
    """When a GPU's signal counts as deviating from its peers.  Defaults from
    docs/stragglers.md (Iglewicz-Hoaglin 3.5; 10 % effect); the persistence is a setting,
    given by `StragglerSettings.thresholds()` (5 minutes unless set)."""

    z: float = 3.5  # |M| must exceed this
    min_effect_ratio: float = 0.10  # |x - median| >= this * |median| ...
    min_abs_effect: Mapping[str, float] = field(
        default_factory=lambda: dict(DEFAULT_MIN_ABS_EFFECT))  # ... and >= this (signal units)
    mad_floor_ratio: float = 0.01  # MAD floor: this * |median| ...
    mad_epsilon: Mapping[str, float] = field(
        default_factory=lambda: dict(DEFAULT_MAD_EPSILON))  # ... and this (signal units)
    persistence_seconds: float = field(kw_only=True)
    min_group_size: int = 3  # fewer GPUs in a group: no peer statistics


def row_medians(x: np.ndarray) -> np.ndarray:
    """np.nanmedian(x, axis=1) of a 2-D array, the same values at a fraction of the cost
    (numpy's goes through masked arrays for small inputs): the mean of the middle two
    of each row's sorted values (NaN sorts last), a middle one taken twice when odd."""
    if not x.shape[1]:
        return np.full(x.shape[0], np.nan)
    s = np.sort(x, axis=1)
    k = x.shape[1] - np.isnan(x).sum(axis=1)  # values per row; none: NaN (s[:, 0])
    rows = np.arange(x.shape[0])
    return (s[rows, np.maximum(k - 1, 0) // 2] + s[rows, k // 2]) / 2


def _mad_scores(x: np.ndarray, mad_floor_ratio: float, epsilon: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Modified z-scores of each row of ``x`` (S, n) against the row's median, with the
    MAD floored at max(mad_floor_ratio * |median|, epsilon): MAD = 0 never divides by zero.

    Returns (scores, medians, effective MADs, |x - median|, finite count per row).
    Rows without a finite value get median 0 (callers mask them by the count)."""
    ok = np.isfinite(x)
    cnt = ok.sum(axis=1)
    with np.errstate(all="ignore"):
        med = row_medians(np.where(cnt[:, None] > 0, x, 0.0))
        dev = np.abs(x - med[:, None])
        mad = row_medians(np.where(cnt[:, None] > 0, dev, 0.0))
    floor = np.maximum.reduce([np.nan_to_num(mad), mad_floor_ratio * np.abs(med), epsilon])
    floor = np.maximum(floor, 1e-300)
    return MAD_SCALE * (x - med[:, None]) / floor[:, None], med, floor, dev, cnt


def modified_z(values: np.ndarray, *, mad_floor_ratio: float = 0.01, epsilon: float = 1e-9
               ) -> tuple[np.ndarray, float, float]:
    """Modified z-scores of ``values`` (NaN stays NaN) against their own median.

    Returns (scores, median, effective MAD), where the effective MAD is
    max(MAD, mad_floor_ratio * |median|, epsilon) > 0: MAD = 0 never divides by
    zero.  With no finite value the scores are NaN and median and MAD are NaN.
    """
    x = np.asarray(values, dtype=np.float64)
    if not np.isfinite(x).any():
        return np.full(x.shape, np.nan), math.nan, math.nan
    score, med, floor, _, _ = _mad_scores(x.reshape(1, -1), mad_floor_ratio,
                                          np.array([epsilon]))
    return score.reshape(x.shape), float(med[0]), float(floor[0])


def group_index(ids: Sequence[int], groups: Mapping[int, str] | None
                 ) -> dict[str, list[int]]:
    """group -> row positions; GPUs without a group share the group ""."""
    out: dict[str, list[int]] = {}
    for i, g in enumerate(ids):
        out.setdefault(str(groups.get(g, "")) if groups else "", []).append(i)
    return out


@dataclass(frozen=True)
class SignalScore:
    """One GPU's signal in one window, against its group."""

    value: float
    median: float  # of the group (NaN without peer statistics)
    score: float  # modified z-score M (NaN without peer statistics or without a value)
    deviating: bool  # |M| > z and the effect gate passed, in this window
    direction: str | None  # "low" or "high" while deviating
    since: float | None  # time the current deviation began (first deviating update)
    outlier: bool  # deviating for at least the persistence


@dataclass(frozen=True)
class Outlier:
    """A GPU's signal that has deviated from its peers for at least the persistence."""

    gpu: int
    signal: str
    direction: str
    score: float
    since: float


@dataclass(frozen=True)
class GpuStraggler:
    gpu: int
    group: str
    peer_statistics: bool
    reason: str | None  # why there are no peer statistics
    straggler: bool
    signals: tuple[str, ...]  # its outlying signals
    since: float | None  # earliest start among its outliers
    scores: dict[str, SignalScore]


@dataclass(frozen=True)
class GroupStatus:
    group: str
    gpus: tuple[int, ...]
    peer_statistics: bool
    reason: str | None


@dataclass(frozen=True)
class StragglerReport:
    """Result of :meth:`StragglerDetector.update`, ready to export."""

    time: float
    gpus: dict[int, GpuStraggler]
    outliers: tuple[Outlier, ...]
    groups: tuple[GroupStatus, ...]
    peer_statistics: bool  # at least one group had peer statistics
    reason: str | None  # set when no group had them


def _deviations(m: np.ndarray, rows: list[int], signals: Sequence[str],
                th: StragglerThresholds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores, medians and 'deviating' for the rows of one group: (S, n), (S,), (S, n)."""
    x = m[:, rows]
    ok = np.isfinite(x)
    eps = np.array([th.mad_epsilon.get(s, 1e-9) for s in signals])
    score, med, _, dev, cnt = _mad_scores(x, th.mad_floor_ratio, eps)
    gate = np.maximum(th.min_effect_ratio * np.abs(med),
                      np.array([th.min_abs_effect.get(s, 0.0) for s in signals]))
    enough = (cnt >= th.min_group_size)[:, None]
    with np.errstate(invalid="ignore"):
        deviating = ok & enough & (np.abs(score) > th.z) & (dev >= gate[:, None])
    score = np.where(ok & enough, score, np.nan)
    med = np.where(cnt >= th.min_group_size, med, np.nan)
    return score, med, deviating


@dataclass
class _Held:
    direction: str
    since: float
    group: str


class StragglerDetector:
    """Per GPU and signal, since when it has deviated from its peers.

    Call :meth:`update` once per window with that window's features; a
    deviation becomes an outlier once it has held for
    ``thresholds.persistence_seconds`` (measured between update times), and
    clears at the first update where it no longer holds (or flips direction,
    or the GPU changes group).
    """

    def __init__(self, thresholds: StragglerThresholds,
                 signals: Sequence[str] = SIGNALS) -> None:
        bad = [s for s in signals if s not in SIGNALS]
        if bad:
            raise ValueError(f"unknown signals {bad}; known: {', '.join(SIGNALS)}")
        self.thresholds = thresholds
        if self.thresholds.min_group_size < 2:
            raise ValueError("min_group_size must be at least 2")
        if self.thresholds.persistence_seconds < 0:
            raise ValueError("persistence_seconds must not be negative")
        self.signals = tuple(signals)
        self._held: dict[tuple[int, str], _Held] = {}

    def reset(self) -> None:
        self._held.clear()

    def update(self, features: WindowFeatures, t: float | None = None,
               groups: Mapping[int, str] | None = None) -> StragglerReport:
        """Score one window.  ``t`` defaults to the window's end;
        ``groups`` maps GPU -> job id (compare only within a job)."""
        now = features.t_end if t is None else float(t)
        th = self.thresholds
        ids, m = features.matrix(self.signals)
        score = np.full(m.shape, np.nan)
        med = np.full(m.shape, np.nan)
        deviating = np.zeros(m.shape, dtype=bool)
        group_of: dict[int, str] = {}
        statuses: list[GroupStatus] = []
        for name, rows in group_index(ids, groups).items():
            gids = tuple(ids[i] for i in rows)
            for g in gids:
                group_of[g] = name
            label = f"group {name!r}" if name else "the node"
            if len(rows) < th.min_group_size:
                statuses.append(GroupStatus(
                    name, gids, False,
                    f"{label} has {len(rows)} GPU(s); peer statistics need at least "
                    f"{th.min_group_size}"))
                continue
            s, md, dv = _deviations(m, rows, self.signals, th)
            score[:, rows] = s
            med[:, rows] = md[:, None]
            deviating[:, rows] = dv
            statuses.append(GroupStatus(name, gids, True, None))
        gpus: dict[int, GpuStraggler] = {}
        outliers: list[Outlier] = []
        seen: set[tuple[int, str]] = set()
        for j, g in enumerate(ids):
            scores: dict[str, SignalScore] = {}
            flagged: list[str] = []
            first: float | None = None
            for k, sig in enumerate(self.signals):
                key = (g, sig)
                sc = float(score[k, j])
                held = None
                if deviating[k, j]:
                    direction = HIGH if sc > 0 else LOW
                    held = self._held.get(key)
                    if held is None or held.direction != direction or held.group != group_of[g]:
                        held = _Held(direction, now, group_of[g])
                        self._held[key] = held
                    seen.add(key)
                is_outlier = held is not None and now - held.since >= th.persistence_seconds
                scores[sig] = SignalScore(
                    float(m[k, j]), float(med[k, j]), sc, bool(deviating[k, j]),
                    held.direction if held else None, held.since if held else None, is_outlier)
                if is_outlier and held is not None:
                    flagged.append(sig)
                    outliers.append(Outlier(g, sig, held.direction, sc, held.since))
                    first = held.since if first is None else min(first, held.since)
            st = next(s for s in statuses if s.group == group_of[g])
            gpus[g] = GpuStraggler(g, group_of[g], st.peer_statistics, st.reason,
                                   bool(flagged), tuple(flagged), first, scores)
        for key in [k for k in self._held if k not in seen]:
            del self._held[key]
        any_stats = any(s.peer_statistics for s in statuses)
        reason = None
        if not any_stats:
            reason = "; ".join(s.reason or "" for s in statuses) or "no GPUs"
        return StragglerReport(now, gpus, tuple(outliers), tuple(statuses), any_stats, reason)
