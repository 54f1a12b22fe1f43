"""The goodput account of a whole trace, seen with hindsight (``analyze``): per-second
evidence from a trace's readings, lost GPUs from their missing readings, holes bridged
whole or not at all, then the one :class:`~exporter.analysis.goodput.Ledger`
(docs/goodput.md). Pure numpy."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from exporter.analysis.goodput import (
    FLOOR_PERCENTILE,
    LEVEL_PERCENTILE,
    GoodputThresholds,
    Ledger,
    Second,
    work_and_waiting,
)

THRESHOLDS = GoodputThresholds()

# offline, sparse readings: a pause must last as long as two runs of this many readings,
# so readings caught in a step's low phase are no pause (instant readings once a second of
# a step near a whole number of seconds long catch its communication phase several times
# in a row)
SPARSE_SAMPLES = 5


def sparse_seconds(sample_interval_seconds: float) -> int:
    """Seconds that hold SPARSE_SAMPLES readings (offline; one where readings are dense):
    a pause or stall lasts at least two such."""
    return max(1, math.ceil(SPARSE_SAMPLES * sample_interval_seconds - 1e-9))


# offline: readings gone this long while peers report through PEERS_REPORTING of it is a
# lost GPU: far past the longest poll stall of a busy host (1-3 s in real logs, and the
# bridge), short against the minutes a lost GPU stays gone
LOST_SECONDS = 30.0
PEERS_REPORTING = 0.9


def lost_runs(has: np.ndarray, min_seconds: float) -> np.ndarray:
    """Offline evidence of a lost GPU (N, T) from which seconds have readings (1 s bins):
    a run of at least ``min_seconds`` without readings while another GPU of the node has
    readings through most (PEERS_REPORTING) of it. Live, NVML says lost itself."""
    h = np.asarray(has, dtype=bool)
    out = np.zeros(h.shape, dtype=bool)
    if h.shape[0] < 2:
        return out  # no peer to say the node went on
    for gpu in range(h.shape[0]):
        others = np.delete(h, gpu, axis=0)
        for a, b in _missing_runs(h[gpu]):
            if b - a >= min_seconds and others[:, a:b].mean(axis=1).max() >= PEERS_REPORTING:
                out[gpu, a:b] = True
    return out


def hold_short_holes(has: np.ndarray, most: int) -> np.ndarray:
    """Which seconds (N, T) lie in a hole of at most ``most`` seconds after a reading: the
    ones an account holds over from the reading before."""
    h = np.asarray(has, dtype=bool)
    out = np.zeros(h.shape, dtype=bool)
    for gpu in range(h.shape[0]):
        for a, b in _missing_runs(h[gpu]):
            if a > 0 and b - a <= most:
                out[gpu, a:b] = True
    return out


def _missing_runs(has: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of seconds without readings in one GPU's row."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], (~has).astype(np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def _hold(x: np.ndarray, where: np.ndarray) -> np.ndarray:
    """x with each marked second taking the value of the last unmarked one before it."""
    idx = np.where(where, 0, np.arange(x.shape[1])[None, :])
    np.maximum.accumulate(idx, axis=1, out=idx)
    return np.take_along_axis(x, idx, axis=1)


def account(power: np.ndarray, *, weights: np.ndarray, utilization: np.ndarray | None = None,
            tdp: np.ndarray | None = None, stalled: np.ndarray | None = None,
            failed: np.ndarray | None = None, sparse: int = 1,
            thresholds: GoodputThresholds = THRESHOLDS) -> Ledger:
    """The whole account of a stretch seen with hindsight (``analyze``): per-second power
    (N, T) (NaN: no reading), the seconds' lengths (T,) (the last may be partial),
    utilization (N, T), power limits (N,), the stall check's GPUs (N, T) and the failed
    GPUs (N, T) (None: :func:`lost_runs` of the missing readings), every GPU held by one
    job. Each GPU's floor and level are percentiles of its power (see :func:`working`).

    With hindsight a hole is bridged whole or not at all: holes up to ``bridge_seconds``
    hold the readings before them, longer ones are ``unknown`` throughout (live, the
    ledger holds the first ``bridge_seconds`` of any hole: it cannot know its length)."""
    p = np.atleast_2d(np.asarray(power, dtype=np.float64))
    n, t = p.shape
    held_over = hold_short_holes(np.isfinite(p), int(round(thresholds.bridge_seconds)))
    p = _hold(p, held_over)
    if utilization is not None:
        utilization = _hold(np.asarray(utilization, dtype=np.float64), held_over)
    has = np.isfinite(p)
    # each second is judged on its own readings (a mean over several seconds would move a
    # pause's edges by how its GPUs' levels compare, and hide a light GPU's compute phase
    # among its communication readings); sparse ones must show a pause for longer
    thresholds = dataclasses.replace(
        thresholds, fill_seconds=max(thresholds.fill_seconds, 2.0 * sparse))
    floor, level = np.full(n, np.nan), np.full(n, np.nan)
    for i in range(n):
        fin = p[i][has[i]]
        if fin.size:
            floor[i], level[i] = np.percentile(fin, [FLOOR_PERCENTILE, LEVEL_PERCENTILE])
    # the power limit, where unknown the GPU's highest power (never above its limit:
    # spinning may be missed, light work is not taken for it)
    top = np.array([np.max(row[np.isfinite(row)]) if np.isfinite(row).any() else np.nan
                    for row in p])
    limit = top if tdp is None else np.where(np.isfinite(tdp), tdp, top)
    works, waits, busy_low = work_and_waiting(p, floor, level, utilization, tdp, limit,
                                              thresholds)
    if failed is None:
        failed = lost_runs(has, max(LOST_SECONDS, 2 * thresholds.bridge_seconds))
    stall = np.zeros((n, t), dtype=bool) if stalled is None else np.asarray(stalled, bool)
    ledger = Ledger(n, dataclasses.replace(thresholds, bridge_seconds=0.0))
    for i in range(t):
        ledger.step(Second(float(weights[i]), has[:, i], p[:, i], works[:, i], waits[:, i],
                           stall[:, i], failed[:, i], busy_low=busy_low[:, i]))
    ledger.close()
    return ledger


def per_second(t: np.ndarray, values: np.ndarray, start: float, bins: int) -> np.ndarray:
    """Mean of each row's finite values (N, m) at times ``t`` (m,) or (N, m) in each
    second [start + i, start + i + 1), i < bins; NaN for a second without one."""
    v = np.atleast_2d(np.asarray(values, dtype=np.float64))
    tt = np.broadcast_to(np.asarray(t, dtype=np.float64), v.shape)
    out = np.full((v.shape[0], bins), np.nan)
    for i in range(v.shape[0]):
        ok = np.isfinite(v[i]) & np.isfinite(tt[i])
        idx = np.floor(tt[i, ok] - start).astype(np.int64)
        keep = (idx >= 0) & (idx < bins)
        idx, x = idx[keep], v[i, ok][keep]
        count = np.bincount(idx, minlength=bins)
        total = np.bincount(idx, weights=x, minlength=bins)
        np.divide(total, count, out=out[i], where=count > 0)
    return out
