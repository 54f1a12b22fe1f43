"""detect_ramps skips candidates that cannot hold a level before measuring them: the
result must be the same as checking every candidate in full (the plain code below,
detect_ramps as it was before that)."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pytest

from exporter.analysis.ramps import Ramp, _regular, detect_ramps
from tests.tools import REAL_TRACE

T0 = 1_758_000_000.0


def reference_ramps(t: np.ndarray, node_power: np.ndarray, tdp_total: float | None = None,
                    *, min_ratio: float = 0.30, max_duration_seconds: float = 5.0,
                    hold_seconds: float = 25.0, max_level_drift: float = 0.25) -> list[Ramp]:
    """detect_ramps as first written: every run of one sign is checked in full."""
    regular = _regular(t, node_power, 4)
    if regular is None:
        return []
    grid, x, dt = regular
    if tdp_total and tdp_total > 0:
        thr = min_ratio * tdp_total
    else:
        lo, hi = np.percentile(x, [1, 99])
        thr = min_ratio * max(float(hi - lo), 0.25 * float(hi))
    if thr <= 0:
        return []
    w = max(1, int(round(max_duration_seconds / dt)))
    if x.size <= w:
        return []
    d = x[w:] - x[:-w]
    sign = np.where(d >= thr, 1, np.where(d <= -thr, -1, 0))
    h = max(2, int(round(hold_seconds / 2 / dt)))
    min_side = max(1, h // 3)
    csum = np.concatenate([[0.0], np.cumsum(x)])
    ramps: list[Ramp] = []
    floor = 1
    i = 0
    while i < sign.size:
        if sign[i] == 0:
            i += 1
            continue
        j = i
        while j + 1 < sign.size and sign[j + 1] == sign[i]:
            j += 1
        s = int(sign[i])
        a = i + int(np.argmax(s * d[i:j + 1]))
        ramp = reference_ramp_at(x, csum, grid, a, w, h, min_side, s, thr, max_level_drift, floor)
        if ramp is not None:
            ramps.append(ramp)
            floor = int(np.searchsorted(grid, ramp.time)) + h
            j = max(j, floor)
        i = j + 1
    return ramps


def reference_ramp_at(x: np.ndarray, csum: np.ndarray, grid: np.ndarray, a: int, w: int,
                      h: int, min_side: int, s: int, thr: float, max_drift: float, floor: int
                      ) -> Ramp | None:
    """_ramp_at as first written: it searched the split point itself."""
    n = x.size
    dt = float(grid[1] - grid[0])
    # split point: where the mean of h samples after minus h before is largest
    lo, hi = max(floor, a - h), min(n - 1, a + w + h)
    if hi < lo:
        return None
    c = np.arange(lo, hi + 1)
    nb = np.minimum(c, h)
    na = np.minimum(n - c, h)
    mb = (csum[c] - csum[c - nb]) / nb
    ma = (csum[c + na] - csum[c]) / na
    c0 = int(c[np.argmax(s * (ma - mb))])
    if c0 == hi and hi < n - 1:
        return None  # the change goes on past this candidate: a later one will see it
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
    b_lo, b_hi = np.percentile(before[1], [5, 95])
    a_lo, a_hi = np.percentile(after[0], [5, 95])
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


def synthetic(seed: int, seconds: float = 120.0, fs: float = 25.0
              ) -> tuple[np.ndarray, np.ndarray]:
    """A node's power: random held levels (job start/stop, crash, pause) with quick or
    slow edges, a step swing on some of them, noise, and sometimes missing samples."""
    rng = np.random.default_rng(seed)
    t = T0 + np.arange(int(seconds * fs)) / fs
    level = np.full(t.size, rng.uniform(400, 1500))
    for _ in range(int(rng.integers(0, 6))):
        at = int(rng.integers(0, t.size))
        level[at:] = rng.uniform(400, 5500)
    k = int(rng.choice([1, 5, 50, 200]))  # edges from instant to 4 s
    level = np.convolve(np.pad(level, (k // 2, k - 1 - k // 2), mode="edge"),
                        np.ones(k) / k, mode="valid")
    f = rng.uniform(0.2, 2.0)
    swing = rng.choice([0.0, 0.3, 0.8]) * level * (((t - T0) * f) % 1.0 < rng.uniform(0.2, 0.8))
    x = level - swing + rng.normal(0, rng.choice([5.0, 50.0]), t.size)
    if seed % 3 == 0:  # gaps: failed reads, bridged by the resampling
        keep = np.ones(t.size, dtype=bool)
        for _ in range(4):
            at = int(rng.integers(0, t.size - 30))
            keep[at:at + int(rng.integers(1, 30))] = False
        t, x = t[keep], x[keep]
    return t, x


def check(t: np.ndarray, x: np.ndarray, **kw) -> list[Ramp]:
    for tdp in (5600.0, None):
        got = detect_ramps(t, x, tdp, **kw)
        assert got == reference_ramps(t, x, tdp, **kw)
    return got


def test_same_ramps_as_checking_every_candidate_on_synthetic_nodes() -> None:
    found = 0
    for seed in range(40):
        t, x = synthetic(seed)
        found += len(check(t, x))
        found += len(check(t, x, min_ratio=0.1, hold_seconds=10.0, max_level_drift=0.5))
        found += len(check(t[-1500:], x[-1500:]))  # the live minute
    assert found > 30  # the cases do hold ramps, not only rejected candidates


def test_same_ramps_on_pure_noise_and_flat_power() -> None:
    rng = np.random.default_rng(1)
    t = T0 + np.arange(3000) / 50.0
    check(t, rng.normal(3000, 800, t.size))
    check(t, np.full(t.size, 2000.0))
    check(t, np.cumsum(rng.normal(0, 60, t.size)) + 3000)  # a random walk


@pytest.mark.skipif(not REAL_TRACE.exists(), reason="shared/data is not beside the checkout")
def test_same_ramps_on_a_real_trace() -> None:
    rows: dict[float, float] = {}
    with open(REAL_TRACE) as f:
        next(f)
        for line in f:
            stamp, _, _, _, watts = (v.strip() for v in line.split(","))
            when = datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows[when] = rows.get(when, 0.0) + float(watts.split()[0])
    t = np.array(sorted(rows))
    x = np.array([rows[v] for v in t])
    found = len(check(t, x))
    for start in range(0, t.size - 200, 97):  # minute-long windows, as the live analysis
        found += len(check(t[start:start + 200], x[start:start + 200], min_ratio=0.1))
    assert found > 0


def test_same_ramps_on_staircases_with_loose_holds() -> None:
    """Many steps close together: ramps whose hold ends inside the next run of changes."""
    t = T0 + np.arange(1200) / 10.0
    for seed in [*range(20), 228, 244]:  # 228, 244: a hold cutting a run short matters
        rng = np.random.default_rng(seed)
        x = np.zeros(t.size)
        level, k = 500.0, 0
        while k < t.size:
            steps = int(rng.uniform(2, 15) * 10)
            level += rng.choice([-1, 1, 1]) * rng.uniform(0, 2500)
            x[k:k + steps] = level
            k += steps
        x += rng.normal(0, 30, t.size)
        check(t, x)
        check(t, x, hold_seconds=6.0, max_level_drift=1.0)
        check(t, x, hold_seconds=4.0, max_level_drift=2.0, min_ratio=0.1)
