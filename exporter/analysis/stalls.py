"""Stalls: most GPUs of a group busy-wait in a collective (utilization high, power far
below their own compute level) while one or a few look different (idle, or still
computing at high power): those are the likely culprits. Pure numpy (docs/stragglers.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from exporter.analysis.signal import percentile as _percentile
from exporter.analysis.straggler import group_index


@dataclass(frozen=True)
class StallThresholds:
    """When a short window counts as a stall (see docs/stragglers.md)."""

    busy_utilization: float = 0.9  # waiting GPUs look busy ...
    wait_level: float = 0.6  # ... at power <= this * their own compute level
    culprit_level: float = 0.8  # a culprit still computes (power >= this * its level) ...
    low_utilization: float = 0.5  # ... or is idle (utilization <= this)
    min_waiting: int = 2  # at least this many waiting GPUs in the group ...
    min_waiting_share: float = 0.5  # ... and at least this share of the group


@dataclass(frozen=True)
class StallResult:
    stalled: bool
    waiting_gpus: tuple[int, ...]
    culprit_gpus: tuple[int, ...]
    groups: tuple[str, ...]  # the groups that stalled
    # "checkpoint": the signature, but the job's first rank writing a checkpoint in its
    # rhythm (analysis.checkpoints): not a stall (``stalled`` is False), said apart
    cause: str = "stall"


def compute_level(power: np.ndarray, percentile: float = 95.0) -> np.ndarray:
    """Each GPU's compute power level: the ``percentile`` of its power (N, M)
    over a context long enough to contain compute phases (~2 min)."""
    p = np.atleast_2d(np.asarray(power, dtype=np.float64))
    if p.shape[1] and np.isfinite(p).all():
        return _percentile(p, percentile, axis=1)
    out = np.full(p.shape[0], np.nan)
    for i, row in enumerate(p):
        fin = row[np.isfinite(row)]
        if fin.size:
            out[i] = float(_percentile(fin, percentile))
    return out


def _waiting(u: np.ndarray, power: np.ndarray, level: np.ndarray, th: StallThresholds
             ) -> tuple[np.ndarray, np.ndarray]:
    """Each GPU's power relative to its level, and whether it busy-waits."""
    p = np.asarray(power, dtype=np.float64)
    lv = np.asarray(level, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(lv > 0, p / lv, np.nan)
        return rel, (u >= th.busy_utilization) & (rel <= th.wait_level)


def stall_matrix(utilization: np.ndarray, power: np.ndarray, level: np.ndarray,
                 group_rows: Sequence[Sequence[int]], th: StallThresholds
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stall rule on K windows at once.

    ``utilization``, ``power`` (mean over each short window) and ``level`` (each
    GPU's compute level) are (N, K).  Returns (stalled (K,), waiting (N, K),
    culprit (N, K)); waiting and culprit are False outside stalled groups.
    """
    u = np.asarray(utilization, dtype=np.float64)
    rel, wait = _waiting(u, power, level, th)
    with np.errstate(invalid="ignore"):
        culp = (~wait) & np.isfinite(u) & np.isfinite(rel) & (
            (u <= th.low_utilization) | (rel >= th.culprit_level))
    waiting = np.zeros(u.shape, dtype=bool)
    culprit = np.zeros(u.shape, dtype=bool)
    stalled = np.zeros(u.shape[1], dtype=bool)
    for rows in group_rows:
        r = list(rows)
        nw = wait[r].sum(axis=0)
        hit = (nw >= th.min_waiting) & (nw >= th.min_waiting_share * len(r)) & \
            culp[r].any(axis=0)
        waiting[r] = wait[r] & hit
        culprit[r] = culp[r] & hit
        stalled |= hit
    return stalled, waiting, culprit


def detect_stall(utilization: np.ndarray, power: np.ndarray, level: np.ndarray, *,
                 gpus: Sequence[int] | None = None, groups: Mapping[int, str] | None = None,
                 thresholds: StallThresholds | None = None) -> StallResult:
    """Stall signature over one short window (a few seconds).

    ``utilization`` (ratio) and ``power`` (watts): (N,) means over the window;
    ``level``: (N,) each GPU's compute level (:func:`compute_level` over the
    last ~2 minutes).  A group stalls when at least ``min_waiting`` GPUs (and
    ``min_waiting_share`` of it) busy-wait, utilization >= ``busy_utilization``
    at power <= ``wait_level`` x their level, while at least one other GPU of
    the group is idle (utilization <= ``low_utilization``) or still computing
    (power >= ``culprit_level`` x its level): the culprits.
    """
    u = np.asarray(utilization, dtype=np.float64).reshape(-1)
    n = u.size
    ids = [int(g) for g in gpus] if gpus is not None else list(range(n))
    if len(ids) != n:
        raise ValueError("gpus must name every GPU")
    th = thresholds or StallThresholds()
    power = np.asarray(power, dtype=np.float64).reshape(n)
    level = np.asarray(level, dtype=np.float64).reshape(n)
    # Most seconds nothing busy-waits: no group can stall, and the rule need not run
    # (this is checked every second).
    if th.min_waiting >= 1 and _waiting(u, power, level, th)[1].sum() < th.min_waiting:
        return StallResult(False, (), (), ())
    gi = group_index(ids, groups)
    stalled, waiting, culprit = stall_matrix(
        u[:, None], power[:, None], level[:, None], list(gi.values()), th)
    hit_groups = tuple(name for name, rows in gi.items() if waiting[rows, 0].any())
    return StallResult(bool(stalled[0]), tuple(ids[i] for i in np.flatnonzero(waiting[:, 0])),
                       tuple(ids[i] for i in np.flatnonzero(culprit[:, 0])), hit_groups)
