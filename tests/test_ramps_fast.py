"""detect_ramps skips candidates that cannot hold a level before measuring them: the
result must be the same as checking every candidate in full (the plain code below,
detect_ramps as it was before that)."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pytest

from exporter.analysis.ramps import Ramp, _ramp_at, _regular, _threshold, detect_ramps
from tests.tools import REAL_TRACE, assert_same_numbers

T0 = 1_758_000_000.0


def reference_ramps(t: np.ndarray, node_power: np.ndarray, tdp_total: float | None = None,
                    *, min_ratio: float = 0.30, max_duration_seconds: float = 5.0,
                    hold_seconds: float = 25.0, max_level_drift: float = 0.25) -> list[Ramp]:
    """detect_ramps as first written: every run of one sign is checked in full."""
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
    """_ramp_at as first written: it searched the split point itself (then checked and
    measured it as _ramp_at does)."""
    n = x.size
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
    return _ramp_at(x, grid, c0, w, h, min_side, s, thr, max_drift)  # checked in full


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
        assert_same_numbers(got, reference_ramps(t, x, tdp, **kw))
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
