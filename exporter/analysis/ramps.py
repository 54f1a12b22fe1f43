"""Ramps and dips: large changes of a node's power, one-off or there and back.

- :func:`detect_ramps`: a rise or fall of the node's power to a level that holds
  (job start, stop, crash);
- :func:`detect_dips`: a pause, the node falling well below its working level
  and coming back (checkpoint, stall, restart), with both edges as ramps.

Pure numpy; see docs/power.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exporter.analysis.signal import percentile, resample

# samples (or split points) worked on at a time: a long trace's node power is over a
# million samples, and each whole working array would be another 8 bytes a sample (the
# level checks make ~25 arrays of a block: 3 MiB)
_BLOCK = 1 << 14
_VIEWED = 1 << 16  # values the rolling extremes view at a time


@dataclass(frozen=True)
class Ramp:
    time: float  # seconds (same clock as the input t) at the middle of the ramp
    direction: str  # "rise" or "fall"
    delta_watts: float  # level after - level before (negative for a fall)
    duration_seconds: float  # 10 %-90 % of the change


def _regular(t: np.ndarray, node_power: np.ndarray, least: int
             ) -> tuple[np.ndarray, np.ndarray, float] | None:
    """The node's power on a regular grid (grid, watts, step); None with fewer than
    `least` samples or a gap the grid cannot bridge."""
    t = np.asarray(t, dtype=np.float64)
    if t.size < least:
        return None
    grid, xs = resample(t, np.asarray(node_power, dtype=np.float64)[None, :])
    if not np.isfinite(xs[0]).all():
        return None
    return grid, xs[0], float(grid[1] - grid[0])


def detect_ramps(
    t: np.ndarray,
    node_power: np.ndarray,
    tdp_total: float | None = None,
    *,
    min_ratio: float = 0.30,
    max_duration_seconds: float = 5.0,
    hold_seconds: float = 25.0,
    max_level_drift: float = 0.25,
) -> list[Ramp]:
    """Large synchronised rises and falls of the node's power.

    A ramp is a change of at least ``min_ratio`` of ``tdp_total`` (of the observed
    p99 - p1 range when the TDP is unknown, but no less than a quarter of p99) within
    ``max_duration_seconds``, to a level that holds: the mean power in each half of
    the ``hold_seconds`` before the ramp and in each half of the ``hold_seconds``
    after it (clear of ``max_duration_seconds`` around the change) must all differ
    by at least the threshold, and the two halves on each side may differ by at most
    ``max_level_drift`` of the change.  That keeps out dips and drops that come back
    within about ``hold_seconds`` (step-time swings, checkpoint cycles).
    The time is where the mean level changes most; the duration runs from
    leaving the old level's p5-p95 range to entering the new level's, so a
    ramp out of a swinging level is timed by its envelope.
    """
    regular = _regular(t, node_power, 4)
    if regular is None:
        return []
    grid, x, dt = regular
    thr = _threshold(x, tdp_total, min_ratio)
    if thr <= 0:
        return []
    w = max(1, int(round(max_duration_seconds / dt)))
    if x.size <= w:
        return []
    sign = _signs(x, w, thr)
    h = max(2, int(round(hold_seconds / 2 / dt)))
    min_side = max(1, h // 3)
    n = x.size
    csum = np.zeros(n + 1)
    np.cumsum(x, out=csum[1:])
    rises, falls = _level_checks(x, csum, w, h, min_side, thr, max_level_drift)
    # runs of one nonzero sign: starts[r]..ends[r]
    edges = np.flatnonzero(np.diff(sign)) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges - 1, [sign.size - 1]])
    nonzero = sign[starts] != 0
    ramps: list[Ramp] = []
    floor = 1  # no split point before the end of the last ramp's hold
    nxt = 0  # the first index of sign not yet looked at
    for i, j in zip(starts[nonzero].tolist(), ends[nonzero].tolist(), strict=True):
        if j < nxt:
            continue
        i = max(i, nxt)  # a run cut by the last ramp's hold goes on from there
        nxt = j + 1
        s = int(sign[i])
        passing = rises if s > 0 else falls
        # a swinging node has many runs, nearly all with no level step near them: the
        # O(1) tests on `passing` skip those before the (costly) exact check
        if passing[min(n - 1, j + w + h) + 1] == passing[max(floor, i - h)]:
            continue
        d = x[i + w:j + 1 + w] - x[i:j + 1]  # the change over w samples from each
        a = i + int(np.argmax(s * d))  # the change lies within x[a..a+w]
        # split point: where the mean of h samples after minus h before is largest
        lo, hi = max(floor, a - h), min(n - 1, a + w + h)
        if hi < lo:
            continue
        e = np.arange(lo, hi + 1)
        jump = _after(csum, e, h) - _before(csum, e, h)  # split scores
        c0 = lo + int(np.argmax(s * jump))
        if c0 == hi and hi < n - 1:
            continue  # the change goes on past this candidate: a later one will see it
        if passing[c0 + 1] == passing[c0]:
            continue
        ramp = _ramp_at(x, grid, c0, w, h, min_side, s, thr, max_level_drift)
        if ramp is not None:
            ramps.append(ramp)
            # one change, one ramp: skip the rest of it and the level it holds
            floor = int(np.searchsorted(grid, ramp.time)) + h
            nxt = max(j, floor) + 1
    return ramps


def _threshold(x: np.ndarray, tdp_total: float | None, min_ratio: float) -> float:
    """The smallest change that is a ramp: ``min_ratio`` of the TDP, or of the
    observed range (at least a quarter of the peak, so noise is never a ramp)."""
    if tdp_total and tdp_total > 0:
        return min_ratio * tdp_total
    lo, hi = percentile(x, [1, 99])
    return min_ratio * max(float(hi - lo), 0.25 * float(hi))


def _signs(x: np.ndarray, w: int, thr: float, block: int = _BLOCK) -> np.ndarray:
    """Per start i: +1 where x rises by at least ``thr`` over the w samples from i, -1
    where it falls by that, else 0 (int8, made a block at a time: a long trace's node
    power holds no whole array of the changes)."""
    m = x.size - w
    sign = np.empty(m, dtype=np.int8)
    for a in range(0, m, block):
        b = min(m, a + block)
        d = x[a + w:b + w] - x[a:b]
        sign[a:b] = np.where(d >= thr, 1, np.where(d <= -thr, -1, 0))
    return sign


def _before(csum: np.ndarray, e: np.ndarray, h: int) -> np.ndarray:
    """The means of the (up to) h samples before each boundary ``e`` (0..n), from the
    cumulative sum ``csum`` (n + 1, a leading 0)."""
    n_before = np.minimum(e, h)
    return (csum[e] - csum[e - n_before]) / np.maximum(n_before, 1)


def _after(csum: np.ndarray, e: np.ndarray, h: int) -> np.ndarray:
    """The means of the (up to) h samples after each boundary ``e`` (0..n)."""
    n_after = np.minimum(csum.size - 1 - e, h)
    return (csum[e + n_after] - csum[e]) / np.maximum(n_after, 1)


def _level_checks(x: np.ndarray, csum: np.ndarray, w: int, h: int, min_side: int, thr: float,
                  max_drift: float, block: int = _BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """Prefix counts (rises, falls) of the split points c that could pass _ramp_at's
    level check: its gap and drift tests on the means of its four windows, here for
    every c (the means of the h samples before/after each boundary, from the cumulative
    sum; a clipped window is shorter), a block of split points at a time.

    A margin covers the rounding of those sums, so a split point that _ramp_at would
    accept is always counted (the converse need not hold: _ramp_at decides).
    """
    n = x.size
    # max |x| without an array of |x|
    margin = 8 * n * n * np.finfo(float).eps * max(float(x.max()), -float(x.min())) \
        + 1e-9 * thr
    counts = (np.zeros(n + 1, dtype=np.int32), np.zeros(n + 1, dtype=np.int32))
    for start in range(0, n, block):
        c = np.arange(start, min(n, start + block))
        # where each window starts or ends, clipped to the signal as x[lo:hi] clips
        i_b0, i_b1 = np.clip(c - w - h, 0, n), np.clip(c - w, 0, n)
        i_a0, i_a1 = np.minimum(c + w, n), np.minimum(c + w + h, n)
        ok = (np.minimum(i_b1, h) >= min_side) & (np.minimum(n - i_a0, h) >= min_side)
        b1, a0 = _before(csum, i_b1, h), _after(csum, i_a0, h)
        # the outer windows count only when long enough: else stand in the inner ones
        b0 = np.where(np.minimum(i_b0, h) >= min_side, _before(csum, i_b0, h), b1)
        a1 = np.where(np.minimum(n - i_a1, h) >= min_side, _after(csum, i_a1, h), a0)
        hi_before, lo_before = np.maximum(b0, b1), np.minimum(b0, b1)
        hi_after, lo_after = np.maximum(a0, a1), np.minimum(a0, a1)
        drift = np.maximum(hi_before - lo_before, hi_after - lo_after)
        for count, gap in zip(counts, (lo_after - hi_before, lo_before - hi_after),
                              strict=True):  # rises, falls
            could = ok & (gap >= thr - margin) & (drift <= max_drift * (gap + margin) + margin)
            # the running count goes on from the block before
            np.cumsum(could, out=count[c[0] + 1:c[-1] + 2], dtype=np.int32)
            count[c[0] + 1:c[-1] + 2] += count[c[0]]
    return counts


def _ramp_at(x: np.ndarray, grid: np.ndarray, c0: int, w: int, h: int, min_side: int, s: int,
             thr: float, max_drift: float) -> Ramp | None:
    """Check and measure the candidate change split at x[c0] (see detect_ramps)."""
    n = x.size
    dt = float(grid[1] - grid[0])
    # levels, clear of the ramp itself (at most w samples either side of c0)
    before = [x[max(0, c0 - w - 2 * h):max(0, c0 - w - h)], x[max(0, c0 - w - h):max(0, c0 - w)]]
    after = [x[c0 + w:c0 + w + h], x[c0 + w + h:c0 + w + 2 * h]]
    if before[1].size < min_side or after[0].size < min_side:
        return None
    b_means = [float(v.mean()) for v in before if v.size >= min_side]
    a_means = [float(v.mean()) for v in after if v.size >= min_side]
    gap = (min(a_means) - max(b_means)) if s > 0 else (min(b_means) - max(a_means))
    drift = max(np.ptp(b_means), np.ptp(a_means))
    if gap < thr or drift > max_drift * gap:
        return None
    # duration: from leaving the old level's p5-p95 range (widened by 10 % of the
    # change) to entering the new one's
    b_lo, b_hi = percentile(before[1], [5, 95])
    a_lo, a_hi = percentile(after[0], [5, 95])
    seg = x[max(0, c0 - w):min(n, c0 + w + 1)]
    base = max(0, c0 - w)
    tol = 0.1 * gap  # flat, drifting levels: like a 10-90 % rise time
    in_old = (seg <= b_hi + tol) if s > 0 else (seg >= b_lo - tol)
    in_new = (seg >= a_lo - tol) if s > 0 else (seg <= a_hi + tol)
    k0 = c0 - base
    old_idx = np.flatnonzero(in_old[:k0 + 1])
    new_idx = np.flatnonzero(in_new[k0:]) + k0
    rs = int(old_idx[-1]) if old_idx.size else 0
    r_end = int(new_idx[0]) if new_idx.size else seg.size - 1
    lb, la = float(before[1].mean()), float(after[0].mean())
    return Ramp(
        time=float(grid[base + (rs + r_end) // 2]),
        direction="rise" if s > 0 else "fall",
        delta_watts=la - lb,
        duration_seconds=float(max(dt, (r_end - rs) * dt)),
    )


# --------------------------------------------------------------------------- dips


@dataclass(frozen=True)
class Dip:
    """A pause: the node's power falls well below its working level and comes back."""

    fall: Ramp  # the edge into the dip
    rise: Ramp  # the edge out of it
    level_before_watts: float  # mean node power over the context before the fall
    level_watts: float  # mean node power inside the dip (clear of its edges)
    level_after_watts: float  # mean node power over the context after the rise

    @property
    def start(self) -> float:
        return self.fall.time

    @property
    def end(self) -> float:
        return self.rise.time

    @property
    def duration_seconds(self) -> float:
        return self.rise.time - self.fall.time

    @property
    def depth_watts(self) -> float:
        return self.level_before_watts - self.level_watts

    @property
    def depth_ratio(self) -> float:
        b = self.level_before_watts
        return self.depth_watts / b if b > 0 else 0.0


def _rolling(x: np.ndarray, w: int, fn: str, trailing: bool = False, block: int = _VIEWED
             ) -> np.ndarray:
    """Rolling max or min over w samples, centred (or trailing), edges padded; a block of
    windows at a time (no padded copy of x, no window-sized temporaries)."""
    if w <= 1:
        return x.copy()
    left = w - 1 if trailing else w // 2
    out = np.empty_like(x)
    step = max(1, block // w)  # ~block values viewed at a time
    for a in range(0, x.size, step):
        b = min(x.size, a + step)
        # the padded signal's samples a .. b + w - 2: x's, the edge value past each end
        part = x[np.clip(np.arange(a - left, b - left + w - 1), 0, x.size - 1)]
        view = np.lib.stride_tricks.sliding_window_view(part, w)
        out[a:b] = view.max(axis=1) if fn == "max" else view.min(axis=1)
    return out


def _first_return(level: np.ndarray, i: int, pre: float, block: int = _BLOCK) -> int | None:
    """The first k >= i where level[k] is back at least half-way from its running minimum
    since i to ``pre``; None if it never is. A block at a time, growing, so a short dip
    reads a few samples, not the rest of the trace (the running minimum carries over)."""
    run_min = np.inf
    a, size = i, min(1 << 10, block)
    while a < level.size:
        part = level[a:a + size]
        low = np.minimum(np.minimum.accumulate(part), run_min)
        back = np.flatnonzero(part >= (pre + low) / 2)
        if back.size:
            return a + int(back[0])
        run_min = float(low[-1])
        a += part.size
        size = min(size * 2, block)
    return None


def detect_dips(
    t: np.ndarray,
    node_power: np.ndarray,
    *,
    min_ratio: float = 0.30,
    fill_seconds: float = 2.0,
    context_seconds: float = 30.0,
    max_seconds: float = 300.0,
) -> list[Dip]:
    """Pauses of the node's power: a fall of at least ``min_ratio`` of the level
    before it, held longer than ``fill_seconds``, and a return at least half-way
    within ``max_seconds`` (longer lows are two ramps: a job's end and the next
    one's start).

    ``fill_seconds`` must exceed the low phase of any swing at the step scale (analyze passes
    the longest step period found): the node's working level is its power with
    gaps narrower than that filled (a morphological closing), so the low phases
    of a swing are no dip, a pause is.  The depth compares mean powers (the
    context before the fall, the dip's inside); each edge is measured on the raw
    signal like a ramp (:class:`Ramp`, ``delta_watts`` between the mean levels).
    """
    regular = _regular(t, node_power, 8)
    if regular is None:
        return []
    grid, x, dt = regular
    w = max(1, int(round(fill_seconds / dt)))
    c = max(2, int(round(context_seconds / dt)))
    level = _rolling(_rolling(x, w, "max"), w, "min")  # working level: short gaps filled
    before = _rolling(level, c, "max", trailing=True)
    dips: list[Dip] = []
    i = 1
    while i < x.size:
        pre = float(before[i - 1])
        if not level[i] < (1 - min_ratio) * pre:
            i += 1
            continue
        j = _first_return(level, i, pre)
        if j is None:
            break  # never comes back: the end of a run, not a dip
        if (j - i) * dt <= max_seconds:
            dip = _measure_dip(x, grid, i, j, w, c, min_ratio)
            if dip is not None:
                dips.append(dip)
        i = j + 1
    return dips


def _measure_dip(x: np.ndarray, grid: np.ndarray, i: int, j: int, w: int, c: int,
                 min_ratio: float) -> Dip | None:
    """Levels and edges of the low stretch x[i:j] (see detect_dips)."""
    edge = max(1, w // 2)
    pre = x[max(0, i - c):max(0, i - edge)]
    inside = x[i + edge:max(i + edge + 1, j - edge)]
    post = x[j + edge:j + c]
    if pre.size < 2 or inside.size < 1 or post.size < 2:
        return None
    lb, ld, la = float(pre.mean()), float(inside.mean()), float(post.mean())
    if lb <= 0 or (lb - ld) / lb < min_ratio:
        return None
    fall = _edge(x, grid, i, w, pre, inside, ld - lb)
    rise = _edge(x, grid, j, w, inside, post, la - ld)
    return Dip(fall, rise, lb, ld, la)


def _edge(x: np.ndarray, grid: np.ndarray, k: int, w: int, old: np.ndarray, new: np.ndarray,
          delta: float) -> Ramp:
    """The ramp near x[k] from the ``old`` samples' level to the ``new`` ones'.

    It runs from the last sample still in the old level's p5-p95 range to the
    first in the new one's (each widened by 10 % of the change), as in detect_ramps.
    """
    dt = float(grid[1] - grid[0])
    s = 1 if delta > 0 else -1
    tol = 0.1 * abs(delta)
    o_lo, o_hi = percentile(old, [5, 95])
    n_lo, n_hi = percentile(new, [5, 95])
    a, b = max(0, k - 2 * w - 2), min(x.size, k + 2 * w + 3)
    seg = x[a:b]
    in_old = (seg <= o_hi + tol) if s > 0 else (seg >= o_lo - tol)
    in_new = (seg >= n_lo - tol) if s > 0 else (seg <= n_hi + tol)
    k0 = k - a
    old_idx = np.flatnonzero(in_old[:k0 + 1])
    start = int(old_idx[-1]) if old_idx.size else 0
    new_idx = np.flatnonzero(in_new[start:]) + start
    end = int(new_idx[0]) if new_idx.size else seg.size - 1
    return Ramp(time=float(grid[a + (start + end) // 2]),
                direction="rise" if s > 0 else "fall",
                delta_watts=delta,
                duration_seconds=float(max(dt, (end - start) * dt)))
