"""The offline scan: the straggler detector and the stall check slid over whole series
(what `analyze` runs on a trace). Pure numpy (docs/stragglers.md).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from exporter.analysis.bridging import Bridge, holes_of, usable
from exporter.analysis.signal import stretch_starts
from exporter.analysis.stalls import StallThresholds, compute_level, stall_matrix
from exporter.analysis.straggler import (
    StragglerDetector,
    StragglerThresholds,
    group_index,
    window_features,
)


@dataclass(frozen=True)
class Outlier:
    """An outlier held over consecutive windows (times as given in ``t``)."""

    gpu: int
    signal: str
    direction: str
    score: float  # median M over the deviating windows
    start: float
    end: float


@dataclass(frozen=True)
class Stall:
    start: float
    end: float
    waiting_gpus: tuple[int, ...]
    culprit_gpus: tuple[int, ...]


@dataclass(frozen=True)
class ScanResult:
    outliers: list[Outlier]
    stalls: list[Stall]
    windows: int  # straggler windows analysed
    peer_statistics: bool
    reason: str | None
    # per GPU and signal: median |M| over the windows that had a score
    typical_scores: dict[int, dict[str, float]]


_STALL_BLOCK = 1 << 14  # short windows judged at a time


class Columns(Protocol):
    """A signal that is made as it is read (analyze's trace fields on its grid): shape
    (N, M), and ``[:, a:b]`` gives the float64 (N, b - a) block of it."""

    shape: tuple[int, int]

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray: ...

    def any_finite(self) -> bool: ...


def _as_grid(v: Any) -> Any:
    """An (N, M) float64 array of a signal given as an array, or a Columns as it is."""
    if v is None or (not isinstance(v, np.ndarray) and hasattr(v, "any_finite")):
        return v
    return np.atleast_2d(np.asarray(v, dtype=np.float64))


def _any_finite(v: Any) -> bool:
    return bool(v.any_finite()) if hasattr(v, "any_finite") else bool(np.isfinite(v).any())


def _window_starts(m: int, n_win: int, n_step: int) -> list[int]:
    if m <= n_win:
        return [0]
    starts = list(range(0, m - n_win + 1, n_step))
    if starts[-1] + n_win < m:
        starts.append(m - n_win)
    return starts


def _moving_mean_blocks(x: np.ndarray | Columns, k: int, block: int,
                        every: np.ndarray | None = None) -> Iterator[np.ndarray]:
    """Mean of each k consecutive samples along the last axis of ``x`` (N, M), ignoring
    NaN, ``block`` windows at a time: (N, <= block) per block, window j covering samples
    j .. j+k-1. ``every`` (M,): False where a sample is read as missing.

    A block at a time so that a long trace holds a block's means, not the whole grid's.
    Each row's running sums carry from one block into the next (a cumulative sum adds
    left to right), so every mean is the one a single pass over the row would give."""
    n, m = x.shape
    nwin = max(0, m - k + 1)
    sums, counts = np.zeros(n), np.zeros(n)
    for a in range(0, nwin, block):
        width = min(block, nwin - a)
        part = x[:, a:a + width + k - 1]
        if every is not None:
            part = np.where(every[a:a + width + k - 1], part, np.nan)
        out = np.full((n, width), np.nan)
        for i, row in enumerate(part):
            ok = np.isfinite(row)
            cs = np.cumsum(np.concatenate([sums[i:i + 1], np.where(ok, row, 0.0)]))
            cn = np.cumsum(np.concatenate([counts[i:i + 1], ok.astype(float)]))
            sums[i], counts[i] = cs[width], cn[width]  # where the next block starts
            s, c = cs[k:] - cs[:-k], cn[k:] - cn[:-k]
            np.divide(s, c, out=out[i], where=c > 0)
        yield out


def _level_mask(t: np.ndarray, measured: np.ndarray | None, bridge: Bridge | None
                ) -> np.ndarray | None:
    """Per GPU and grid time: whether the compute level reads the sample (None: all).

    The level, a p95 over minutes, reads the line across a hole the bridge spans (a hole
    in a short burst at full power would lower it), and no sample a GPU missed
    otherwise. A mask (a byte a sample), not a masked copy of the power grid."""
    if measured is None:
        return None
    keep = np.ones(measured.shape, dtype=bool)
    for row, seen in zip(keep, measured, strict=True):
        if bridge is None:
            row[:] = seen
        elif not seen.all():
            row[:] = usable(t, holes_of(t, seen), bridge)
    return keep


def _levels(power: np.ndarray, keep: np.ndarray | None, centres: np.ndarray, n_ctx: int
            ) -> np.ndarray:
    """Each GPU's compute level (N, len(centres)) over a context centred on each centre;
    the samples ``keep`` rules out read as missing, one context's copy at a time."""
    cols = []
    for c in centres:
        sl = slice(max(0, c - n_ctx // 2), c + n_ctx // 2 + 1)
        part = power[:, sl] if keep is None else np.where(keep[:, sl], power[:, sl], np.nan)
        cols.append(compute_level(part))
    return np.stack(cols, axis=1)


def _bad_windows(valid: np.ndarray | None, m: int, k: int) -> np.ndarray:
    """Per window start j (covering samples j .. j+k-1): whether it holds a sample that is
    not valid (interpolated across a gap in the trace)."""
    n = max(0, m - k + 1)
    if valid is None:
        return np.zeros(n, dtype=bool)
    bad = np.concatenate([[0], np.cumsum(~valid)])
    return (bad[k:k + n] - bad[:n]) > 0


def _scan_outliers(t: np.ndarray, power: np.ndarray, others: dict[str, Any],
                   ids: list[int], groups: Mapping[int, str] | None, window: float,
                   step: float, th: StragglerThresholds, valid: np.ndarray | None
                   ) -> tuple[list[Outlier], int, bool, str | None, dict[int, dict[str, float]]]:
    dt = float(np.median(np.diff(t)))
    m = t.size
    n_win = max(2, int(round(window / dt)))
    n_step = max(1, int(round(step / dt)))
    det = StragglerDetector(th)
    # with gaps, windows are laid between them (None at a gap): none straddles one
    starts: list[int | None] = list(_window_starts(m, n_win, n_step)) if valid is None \
        else stretch_starts(valid, n_win, n_step, tail=True)
    runs: dict[tuple[int, str], list[tuple[int, float, str]]] = {}  # open runs
    closed: list[tuple[int, str, list[tuple[int, float, str]]]] = []
    bounds: list[tuple[float, float]] = []
    any_stats = False
    reason: str | None = None
    # a long trace has ~10,000 windows of 64 scores: float64 arrays, not lists of floats
    all_scores: dict[tuple[int, str], array[float]] = {}
    analysed = 0
    for w, a in enumerate(starts):
        if a is None:  # a gap: what deviated before it must hold anew after it
            bounds.append((math.nan, math.nan))
            closed += [(g, sig, run) for (g, sig), run in runs.items()]
            runs.clear()
            det.reset()
            continue
        b = min(m, a + n_win)
        sl = slice(a, b)
        bounds.append((float(t[a]), float(t[b - 1])))
        analysed += 1
        windowed: dict[str, Any] = {  # window_features' keyword arguments, by name
            k: (v[:, sl] if v is not None else None) for k, v in others.items()}
        feats = window_features(t[sl], power[:, sl], gpus=ids, **windowed)
        rep = det.update(feats, groups=groups)
        any_stats = any_stats or rep.peer_statistics
        reason = reason or rep.reason
        for g, gs in rep.gpus.items():
            for sig, sc in gs.scores.items():
                key = (g, sig)
                if math.isfinite(sc.score):
                    all_scores.setdefault(key, array("d")).append(abs(sc.score))
                run = runs.get(key)
                if sc.deviating and sc.direction is not None:
                    if run is not None and run[-1][2] != sc.direction:
                        closed.append((g, sig, run))
                        run = None
                    if run is None:
                        run = runs[key] = []
                    run.append((w, sc.score, sc.direction))
                elif run is not None:
                    closed.append((g, sig, run))
                    del runs[key]
    for (g, sig), run in runs.items():
        closed.append((g, sig, run))
    out: list[Outlier] = []
    last = len(starts) - 1
    for g, sig, run in closed:
        w0, w1 = run[0][0], run[-1][0]
        held = bounds[w1][1] - bounds[w0][1]
        if held < th.persistence_seconds:
            continue
        # the deviation began about mid-way into its first window (the window's
        # mean crosses the gate when about half of it deviates), except at the edges
        # (of the trace, or of a gap)
        start = bounds[w0][0] if w0 == 0 or starts[w0 - 1] is None else sum(bounds[w0]) / 2
        end = bounds[w1][1] if w1 == last or starts[w1 + 1] is None else sum(bounds[w1]) / 2
        out.append(Outlier(g, sig, run[0][2], float(np.median([s for _, s, _ in run])),
                           start, end))
    out.sort(key=lambda o: (o.start, o.gpu, o.signal))
    typical: dict[int, dict[str, float]] = {}
    for (g, sig), v in sorted(all_scores.items()):
        typical.setdefault(g, {})[sig] = float(np.median(v))
    return out, analysed, any_stats, reason, typical


def _scan_stalls(t: np.ndarray, power: np.ndarray, utilization: np.ndarray | Columns,
                 ids: list[int], groups: Mapping[int, str] | None, window: float, context: float,
                 th: StallThresholds, measured: np.ndarray | None, bridge: Bridge | None
                 ) -> list[Stall]:
    dt = float(np.median(np.diff(t)))
    m = t.size
    k = max(1, int(round(window / dt)))
    if m < k:
        return []
    # the short windows read only the instants at which every GPU was measured: GPUs
    # compared over different instants of a swing (one stopped at a high reading, the
    # others went on into a low one) would make a stall of their own
    every = None if measured is None else np.asarray(measured.all(axis=0))
    # compute level: p95 over a context centred on each window, evaluated every
    # ~context/12 and held in between
    n_ctx = max(k, int(round(context / dt)))
    hop = max(1, n_ctx // 12)
    centres = np.arange(0, m, hop)
    lv_at = _levels(power, _level_mask(t, measured, bridge), centres, n_ctx)
    nwin = m - k + 1
    gi = group_index(ids, groups)
    # a block of windows at a time (each is judged alone), their means made per block:
    # the means and the rule's arrays for every window of a long trace at once would be
    # several times the grid
    stalled = np.zeros(nwin, dtype=bool)
    # who waits and who is the culprit, per GPU and window: a bit each (packbits along the
    # windows; the blocks start at multiples of 8 windows), 2 bits per GPU a window
    waiting = np.zeros((len(ids), (nwin + 7) // 8), dtype=np.uint8)
    culprit = np.zeros((len(ids), (nwin + 7) // 8), dtype=np.uint8)
    means = zip(range(0, nwin, _STALL_BLOCK),
                _moving_mean_blocks(utilization, k, _STALL_BLOCK, every),
                _moving_mean_blocks(power, k, _STALL_BLOCK, every), strict=True)
    for a, u, p in means:
        sl = slice(a, a + u.shape[1])
        mid = np.arange(sl.start, sl.stop) + k // 2
        held = np.minimum(mid // hop, centres.size - 1)  # window -> the level it holds
        stalled[sl], waits, culprits = stall_matrix(u, p, lv_at[:, held], list(gi.values()),
                                                    th)
        bits = slice(sl.start // 8, (sl.stop + 7) // 8)
        waiting[:, bits] = np.packbits(waits, axis=1)
        culprit[:, bits] = np.packbits(culprits, axis=1)
    if measured is not None and bridge is not None:
        stalled = _hold_across_holes(stalled, _bad_windows(every, m, k),
                                     int(bridge.limit_seconds / dt))
    out: list[Stall] = []
    j = 0
    while j < nwin:
        if not stalled[j]:
            j += 1
            continue
        e = j
        while e + 1 < nwin and stalled[e + 1]:
            e += 1
        cul = _bits(culprit, j, e + 1).any(axis=1)
        wai = _bits(waiting, j, e + 1).any(axis=1) & ~cul
        # a short window stalls once about half of it does: date it by its middle
        out.append(Stall(float(t[min(m - 1, j + k // 2)]), float(t[min(m - 1, e + k // 2)]),
                         tuple(ids[i] for i in np.flatnonzero(wai)),
                         tuple(ids[i] for i in np.flatnonzero(cul))))
        j = e + 1
    return out


def _bits(packed: np.ndarray, a: int, b: int) -> np.ndarray:
    """Columns a..b-1 of a bool matrix kept as np.packbits(..., axis=1)."""
    whole = np.unpackbits(packed[:, a // 8:(b + 7) // 8], axis=1)
    return whole[:, a % 8:a % 8 + (b - a)].astype(bool)


def _hold_across_holes(stalled: np.ndarray, in_hole: np.ndarray, most: int) -> np.ndarray:
    """A stall on both sides of a run of windows that touch a hole, at most ``most``
    windows long, held through it (the bridge's ``hold``): the hole hid whether it went on,
    and it did on both sides."""
    out = stalled.copy()
    j, n = 0, stalled.size
    while j < n:
        if stalled[j] or not in_hole[j]:
            j += 1
            continue
        e = j
        while e + 1 < n and in_hole[e + 1] and not stalled[e + 1]:
            e += 1
        if j > 0 and e + 1 < n and stalled[j - 1] and stalled[e + 1] and e - j + 1 <= most:
            out[j:e + 1] = True
        j = e + 1
    return out


def scan(
    t: np.ndarray,
    power: np.ndarray,
    *,
    gpus: Sequence[int] | None = None,
    sm_clock: np.ndarray | Columns | None = None,
    temperature: np.ndarray | Columns | None = None,
    utilization: np.ndarray | Columns | None = None,
    clock_event_reasons: np.ndarray | Columns | None = None,
    nvlink: np.ndarray | Columns | None = None,
    pcie: np.ndarray | Columns | None = None,
    compute: np.ndarray | Columns | None = None,
    groups: Mapping[int, str] | None = None,
    window_seconds: float,
    step_seconds: float,
    thresholds: StragglerThresholds,
    stall_window_seconds: float,
    stall_context_seconds: float,
    stall_thresholds: StallThresholds | None = None,
    valid: np.ndarray | None = None,
    measured: np.ndarray | None = None,
    stall_bridge: Bridge | None = None,
) -> ScanResult:
    """Slide the straggler window and the stall window over whole series.

    All series are (N, M) on the uniform grid ``t`` (M,).  Consecutive
    deviating windows of one GPU and signal become one :class:`Outlier` when
    they held for the persistence; consecutive stalled short windows become one
    :class:`Stall` (its culprits and waiters: the union over its windows).
    Stalls need ``utilization``.  ``valid`` (M,) is False inside the gaps in the trace
    that the straggler windows do not bridge (analysis.bridging): no straggler window
    holds one (they are laid between them, and an outlier must hold anew after one).
    ``measured`` (N, M) is False where a GPU's grid was interpolated across its own gap:
    the stall check reads only the instants every GPU was measured, and holds a stall
    through a gap up to ``stall_bridge``'s limit when it was stalled on both sides.  The
    windows and thresholds are the straggler settings' (analyze hands down its
    `StragglerSettings`); the scan keeps no defaults of its own.
    """
    t = np.asarray(t, dtype=np.float64)
    p = np.atleast_2d(np.asarray(power, dtype=np.float64))
    if t.ndim != 1 or t.size < 2 or p.shape[1] != t.size:
        raise ValueError("need (N, M) power on at least 2 sample times")
    ids = [int(g) for g in gpus] if gpus is not None else list(range(p.shape[0]))
    others = {"sm_clock": sm_clock, "temperature": temperature, "utilization": utilization,
              "clock_event_reasons": clock_event_reasons, "nvlink": nvlink, "pcie": pcie,
              "compute": compute}
    others = {k: _as_grid(v) for k, v in others.items()}
    if valid is not None:
        valid = np.asarray(valid, dtype=bool)
        if valid.shape != t.shape:
            raise ValueError("valid must have one entry per sample time")
    if measured is None and valid is not None:
        measured = np.broadcast_to(valid, p.shape)
    if measured is not None:
        measured = np.asarray(measured, dtype=bool)
        if measured.shape != p.shape:
            raise ValueError("measured must have one entry per GPU and sample time")
    th = thresholds
    outliers, n, stats, reason, typical = _scan_outliers(
        t, p, others, ids, groups, window_seconds, step_seconds, th, valid)
    stalls: list[Stall] = []
    util = others["utilization"]
    if util is not None and _any_finite(util):
        stalls = _scan_stalls(t, p, util, ids, groups, stall_window_seconds,
                              stall_context_seconds, stall_thresholds or StallThresholds(),
                              measured, stall_bridge)
    return ScanResult(outliers, stalls, n, stats, reason, typical)
