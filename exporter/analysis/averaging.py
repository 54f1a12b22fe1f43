"""Does a power series come from an averaging sensor?  Evidence from the data alone.

A T-second boxcar average (power.draw on Hopper and most Ampere boards, T ~ 1 s)
leaves its mark on the samples:

- **edges**: between two held levels it ramps linearly over T, so it cannot cross
  the middle of a step faster than about T (half that if the true swing were
  twice the step): a GPU that jumps between levels from one sample to the next,
  again and again, is not averaged (:func:`edge_evidence`);
- **spectrum**: it passes at most 22 % of any swing above 1.1/T Hz (|sinc|), and
  no swing is larger than the node's peak power, so a swing there of more than
  ~16 % of the peak (rms) means no averaging (:func:`high_frequency_rms`);
- **noise**: what is left after the GPUs' common swing is removed is white for
  an instantaneous reading (as strong above 1.2/T Hz as below 0.4/T Hz) and
  fades through an average (sinc^2: under 0.05) (:func:`noise_floor_ratio`).

The edge and spectrum tests are one-sided proofs against averaging; slow edges
and smooth noise are only consistent with it (a slow real swing looks the same).
:func:`averaging_evidence` combines them into one verdict with its reason.
Pure numpy; nothing here knows where the samples came from.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from exporter.analysis.signal import ColumnBlocks, detrend, hann

INSTANT = "instantaneous"
AVERAGED = "averaged"

_TAU = 0.15  # the outer 15 % of a step on each side count as "at the level"
_PROOF_LOG10 = -3.0  # under averaging, the edges seen would have odds below 1:1000
_MIN_FAST_EDGES = 3
_FLOOR_INSTANT = 0.3  # noise floor above 1.2/T over 0.1-0.4/T: white ~1, averaged < 0.05
_FLOOR_AVERAGED = 0.1
_MAX_EDGES = 200  # per GPU: enough for any verdict, and bounded work
# rms above 1.1 / T over the node's peak: a T-second average passes at most 0.217 of a
# swing there (0.11 of its range in rms), and the range is below ~1.45x the observed peak
_HF_RMS_INSTANT = 0.16


@dataclass(frozen=True)
class EdgeStats:
    transitions: int  # clean level-to-level changes seen (per GPU, median over GPUs)
    fast: int  # of those, crossed faster than an averaging sensor could
    log10_odds_averaged: float  # log10 of the odds averaged : instantaneous given the edges
    median_crossing_seconds: float | None  # time to cross the middle 70 % of a step


@dataclass(frozen=True)
class AveragingEvidence:
    verdict: str | None  # INSTANT, AVERAGED or None (cannot tell)
    proof: bool  # True: physically impossible under the other hypothesis
    reason: str
    stats: dict[str, float | int | None] = field(default_factory=dict)


# --------------------------------------------------------------------------- edges


def _plateau_mask(x: np.ndarray, tol: float, m: int = 2) -> np.ndarray:
    """Samples that belong to some run of m consecutive samples within tol of each other."""
    if x.size < m:
        return np.zeros(x.size, dtype=bool)
    view = np.lib.stride_tricks.sliding_window_view(x, m)
    flat = (view.max(axis=1) - view.min(axis=1)) <= tol
    mask = np.zeros(x.size, dtype=bool)
    for j in range(m):
        mask[j:j + flat.size] |= flat
    return mask


def _runs(x: np.ndarray, tol: float) -> list[tuple[int, int]]:
    """(first, last) index of each held level: plateau samples, split where x jumps."""
    mask = _plateau_mask(x, tol)
    start = mask.copy()
    start[1:] &= ~mask[:-1] | (np.abs(np.diff(x)) > tol)
    firsts = np.flatnonzero(start)
    out = []
    for i, a in enumerate(firsts):
        end = firsts[i + 1] if i + 1 < firsts.size else x.size
        off = np.flatnonzero(~mask[a:end])
        out.append((int(a), int(a + (off[0] if off.size else end - a) - 1)))
    return out


def _transitions(t: np.ndarray, x: np.ndarray) -> list[tuple[float, bool, float]]:
    """Clean changes between held levels: (middle-crossing time, direct, local dt).

    The middle-crossing time runs from the last sample in the old level's band
    (its outer 15 % of the step) to the first in the new one's; ``direct`` when
    no sample lies in between.
    """
    lo, hi = np.percentile(x, [1, 99])
    span = float(hi - lo)
    if span <= 0:
        return []
    sigma = 1.4826 * float(np.median(np.abs(np.diff(x)))) / math.sqrt(2)
    tol = max(5 * sigma, 0.02 * span)
    big = max(0.25 * span, 10 * sigma)
    runs = [r for r in _runs(x, tol) if r[1] - r[0] >= 1]
    out: list[tuple[float, bool, float]] = []
    for (_, e1), (s2, _) in zip(runs, runs[1:], strict=False):
        if len(out) >= _MAX_EDGES:
            break
        a = float(np.median(x[max(0, e1 - 2):e1 + 1]))
        b = float(np.median(x[s2:s2 + 3]))
        if abs(b - a) < big:
            continue
        seg = (x[e1:s2 + 3] - a) / (b - a)  # 0 at the old level, 1 at the new one
        old = np.flatnonzero(seg[:s2 - e1 + 1] <= _TAU)
        if old.size == 0:
            continue
        new = np.flatnonzero(seg[old[-1]:] >= 1 - _TAU)
        if new.size == 0:
            continue
        i0, i1 = e1 + int(old[-1]), e1 + int(old[-1]) + int(new[0])
        dt_local = float(np.median(np.diff(t[max(0, e1 - 3):s2 + 4])))
        out.append((float(t[i1] - t[i0]), i1 == i0 + 1, dt_local))
    return out


def _edge_stats(t: np.ndarray, x: np.ndarray, seconds: float) -> EdgeStats:
    """Log-likelihood of this GPU's edges: instantaneous (sharp edges) against averaged."""
    tr = _transitions(t, x)
    # through a T-second average the middle 70 % of a step takes 0.7 T; allow
    # half that in case the true swing was twice the step (power is never negative)
    t_mid = (1 - 2 * _TAU) * seconds / 2
    llr = 0.0
    fast = 0
    for cross, direct, dt_local in tr:
        # a sharp edge (<= ~100 ms with the sensor's own update) leaves a sample in its
        # middle this often
        eps = min(0.9, max(0.05, 0.1 / dt_local))
        if cross < t_mid:
            fast += 1
            llr += 3.0  # impossible through the average (capped: a glitch is not a proof)
        elif direct:
            fast += 1
            llr += math.log10((1 - eps) / max(1e-3, 1 - t_mid / cross))
        else:
            llr += math.log10(eps / min(1.0, 2 * t_mid / dt_local))
    crossings = [c for c, d, _ in tr if not d]
    return EdgeStats(len(tr), fast, -llr,
                     float(np.median(crossings)) if len(crossings) >= 3 else None)


def edge_evidence(series: list[tuple[np.ndarray, np.ndarray]], seconds: float) -> EdgeStats:
    """Edge statistics of each GPU's raw (t, watts), summarised by the median GPU.

    The median, not the sum, because the GPUs of one node change together: their
    edges are not independent evidence.
    """
    stats = [_edge_stats(t, x, seconds) for t, x in series if t.size >= 8]
    if not stats:
        return EdgeStats(0, 0, 0.0, None)
    mid = sorted(stats, key=lambda s: s.log10_odds_averaged)[len(stats) // 2]
    crossings = [s.median_crossing_seconds for s in stats if s.median_crossing_seconds]
    return EdgeStats(int(np.median([s.transitions for s in stats])),
                     int(np.median([s.fast for s in stats])),
                     mid.log10_odds_averaged,
                     float(np.median(crossings)) if crossings else None)


# --------------------------------------------------------------------------- spectrum, noise


def high_frequency_rms(x: np.ndarray, fs: float, cutoff_hz: float) -> float | None:
    """RMS of the part of x above cutoff_hz (watts), or None when the samples cannot show it."""
    if fs / 2 < 1.3 * cutoff_hz or x.size < 32:
        return None
    spec = np.fft.rfft(detrend(x))
    spec[np.fft.rfftfreq(x.size, 1.0 / fs) <= cutoff_hz] = 0
    return float(np.fft.irfft(spec, x.size).std())


def _residuals(block: np.ndarray) -> np.ndarray:
    """Each GPU minus its least-squares fit of the node's mean waveform and slope.

    The common swing cancels (the slope term absorbs a GPU lagging the others
    by a few ms); what is left is each GPU's own noise.
    """
    block = detrend(block)
    ref = block.mean(axis=0)
    basis = np.stack([ref, np.gradient(ref)], axis=1)
    coef, *_ = np.linalg.lstsq(basis, block.T, rcond=None)
    return block - (basis @ coef).T


def noise_floor_ratio(x: np.ndarray | InterpolatedRows, fs: float, seconds: float,
                      segment_seconds: float = 20.0) -> float | None:
    """Median PSD of the GPUs' residual noise above 1.2/T Hz over that at 0.1-0.4/T Hz.

    ``x`` is (N >= 2, M) on a uniform grid (one GPU has no common waveform to
    remove: its own swing would fill the low band).  Medians over many bins
    ignore what is left of periodic swings (peaks); white (instantaneous)
    noise gives ~1, noise through a T-second boxcar ~sinc^2, under 0.05.
    """
    n = int(round(segment_seconds * fs))
    if x.shape[0] < 2 or x.shape[1] < n or n < 32 or fs / 2 < 1.5 / seconds:
        return None
    freqs = np.fft.rfftfreq(n, 1.0 / fs)
    hi = (freqs >= 1.2 / seconds) & (freqs <= 0.9 * fs / 2)
    lo = (freqs >= 0.1 / seconds) & (freqs <= 0.4 / seconds)
    if hi.sum() < 6 or lo.sum() < 4:
        return None
    w = hann(n)
    psd = np.zeros(freqs.size)
    for a in range(0, x.shape[1] - n + 1, n // 2):
        r = _residuals(x[:, a:a + n])
        psd += (np.abs(np.fft.rfft(r * w, axis=1)) ** 2).sum(axis=0)
    # the low band's lower quartile: what is left of a swing there (GPUs swinging
    # on their own, not in step) raises a few bins, not the floor
    floor = float(np.percentile(psd[lo], 25))
    if floor <= 0 or not math.isfinite(floor):
        return None
    return float(np.median(psd[hi])) / floor


def finite_readings(t: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The readings ``x`` that are finite, and their times: the arrays themselves when
    all are (a long trace's series are not copied for nothing)."""
    ok = np.isfinite(x)
    return (t, x) if ok.all() else (t[ok], x[ok])


def sensor_update_seconds(t: np.ndarray, x: np.ndarray) -> float | None:
    """The sensor's own update period, when the readings repeat between steady changes.

    A reading polled faster than its sensor updates repeats, then changes, at a
    steady rhythm: most intervals between changes lie within +-50 % of their
    median, and that median is a sensor's (at most 2 s).  Flat data that changes
    only now and then is no sensor rhythm.
    """
    t, x = finite_readings(t, x)
    if t.size < 16:
        return None
    changed = np.flatnonzero(np.diff(x) != 0) + 1
    if changed.size < 8:
        return None
    gaps = np.diff(t[changed])
    period = float(np.median(gaps))
    steady = float(np.mean(np.abs(gaps - period) <= 0.5 * period)) >= 0.8
    slower = period > 1.5 * float(np.median(np.diff(t)))
    return period if steady and slower and period <= 2.0 else None


# --------------------------------------------------------------------------- verdict


def averaging_evidence(series: list[tuple[np.ndarray, np.ndarray]], seconds: float = 1.0
                       ) -> AveragingEvidence:
    """Is this node's power (each GPU's raw (t, watts)) a ``seconds``-long average?"""
    series = [finite_readings(t, x) for t, x in series]
    series = [(t, x) for t, x in series if t.size >= 8]
    if not series:
        return AveragingEvidence(None, False, "too few samples to tell")
    edges = edge_evidence(series, seconds)
    t0 = max(float(t[0]) for t, _ in series)
    t1 = min(float(t[-1]) for t, _ in series)
    dts = [float(np.median(np.diff(t))) for t, _ in series]
    dt = float(np.median(dts))
    stats: dict[str, float | int | None] = {
        "edges": edges.transitions, "fast_edges": edges.fast,
        "log10_odds_averaged": round(edges.log10_odds_averaged, 1),
        "median_edge_seconds": edges.median_crossing_seconds,
        "sample_interval_seconds": dt}
    grid = None
    if t1 - t0 > 8 * dt:
        times = t0 + np.arange(int((t1 - t0) / dt) + 1) * dt
        grid = InterpolatedRows(times, series)
    hf = None
    if grid is not None:
        node = grid.row_sum()
        rms = high_frequency_rms(node, 1 / dt, 1.1 / seconds)
        peak = float(np.percentile(node, 99.9))
        hf = rms / peak if rms is not None and peak > 0 else None
    rough = noise_floor_ratio(grid, 1 / dt, seconds) if grid is not None else None
    stats["high_frequency_rms_ratio"] = hf
    stats["noise_floor_ratio"] = rough
    return _verdict(edges, hf, rough, dt, seconds, stats)


class InterpolatedRows(ColumnBlocks):
    """Each GPU's readings interpolated onto ``times``, an (N, M) grid never held whole:
    ``[:, a:b]`` makes that block of columns (a long trace's grid is over a million
    samples a GPU), a block of ``block`` columns at a time, kept for the reads in it.
    np.interp's value at a time depends on that time alone, so each block holds what
    the whole grid would."""

    def __init__(self, times: np.ndarray, series: list[tuple[np.ndarray, np.ndarray]],
                 block: int = 1 << 14) -> None:
        self.times, self.series, self.block_columns = times, series, block
        self.shape = (len(series), times.size)

    def block(self, a: int, b: int) -> np.ndarray:
        part = self.times[a:b]
        made = np.empty((self.shape[0], part.size))
        for i, (t, x) in enumerate(self.series):
            made[i] = np.interp(part, t, x)
        return made

    def row_sum(self) -> np.ndarray:
        """The sum over the rows, as ``grid.sum(axis=0)`` adds them (the first row, then
        each next one added in turn), one row made at a time."""
        (t, x), *rest = self.series
        total = np.interp(self.times, t, x)
        for t, x in rest:
            total += np.interp(self.times, t, x)
        return total


def _verdict(edges: EdgeStats, hf: float | None, rough: float | None, dt: float,
             seconds: float, stats: dict[str, float | int | None]) -> AveragingEvidence:
    s = f"{seconds:g} s"
    if edges.fast >= _MIN_FAST_EDGES and edges.log10_odds_averaged <= _PROOF_LOG10:
        return AveragingEvidence(INSTANT, True, (
            f"{edges.fast} of {edges.transitions} edges per GPU cross the middle of their step "
            f"faster than a {s} average can (it ramps over {s})"), stats)
    if hf is not None and hf >= _HF_RMS_INSTANT:
        return AveragingEvidence(INSTANT, True, (
            f"the node swings above {1.1 / seconds:.2g} Hz by {100 * hf:.0f} % of its peak "
            f"(rms); a {s} average passes at most ~11 % there"), stats)
    if rough is not None and rough >= _FLOOR_INSTANT:
        return AveragingEvidence(INSTANT, True, (
            f"the GPUs' own noise is as strong above {1.2 / seconds:.2g} Hz as below "
            f"{0.4 / seconds:.2g} Hz (ratio {rough:.2f}); a {s} average would cut it "
            "below 0.05"), stats)
    consistent = []
    c = edges.median_crossing_seconds
    if edges.transitions >= 3 and edges.log10_odds_averaged >= 2 and c is not None and \
            0.4 * seconds <= c <= seconds + 2 * dt:
        consistent.append(f"edges take {c:.2g} s to cross the middle of their step, with "
                          "samples in between")
    if rough is not None and rough <= _FLOOR_AVERAGED:
        consistent.append(f"the GPUs' own noise fades above {1.2 / seconds:.2g} Hz "
                          f"(ratio {rough:.3f})")
    if consistent:
        return AveragingEvidence(AVERAGED, False, "; ".join(consistent)
                                 + f", as through a {s} average", stats)
    if dt >= seconds:
        why = f"samples {dt:.2g} s apart cannot time a {s} average"
    else:
        why = "no clean edges, no energy above the averaging band and no noise to judge by"
    return AveragingEvidence(None, False, why, stats)


# --------------------------------------------------------------------------- the swing behind it

_SHAPES: tuple[tuple[str, float | None], ...] = (
    ("sine", None), *((f"square, duty {d:.1f}", d) for d in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)))


def _shape(duty: float | None, n: int) -> np.ndarray:
    """One period of a peak-to-peak 1 waveform on n points."""
    ph = np.arange(n) / n
    if duty is None:
        return 0.5 * np.sin(2 * np.pi * ph)
    return (ph < duty).astype(float) - duty


def _averaged(w: np.ndarray, window: float) -> np.ndarray:
    """Circular trailing boxcar over ``window`` periods of one period ``w``."""
    n = w.size
    k = max(1, int(round(window * n)))
    whole = k // n
    c = np.cumsum(np.concatenate([[0.0], np.tile(w, whole + 2)]))
    idx = np.arange(n) + (whole + 1) * n
    return (c[idx + 1] - c[idx + 1 - k]) / k


def source_swing(t: np.ndarray, x: np.ndarray, f: float, seconds: float
                 ) -> tuple[float, str] | None:
    """The swing behind a periodic signal x(t) at f Hz, read through a ``seconds``-long
    average (0: none, for samples too sparse for p95 - p5 to catch the peaks).

    A sine and square waves of several duty cycles, each put through the same
    average, are fitted to the samples at their phase of the period (scale,
    offset, and the phase on a 1/64-period grid), ten periods at a time (so a
    small error in f does not smear the phase); the median over the chunks of
    the best fit's peak-to-peak before averaging is the estimate.  Returns
    (watts, shape), or None with fewer than 4 periods or 3 samples per period.
    """
    per = 1.0 / (f * float(np.median(np.diff(t))))  # samples per period
    if per < 3 or x.size < 4 * per:
        return None
    chunk = int(10 * per)
    fits = [_fit_shape(t[a:a + chunk], x[a:a + chunk], f, seconds)
            for a in range(0, max(1, x.size - chunk + 1), chunk)]
    found = [fit for fit in fits if fit is not None]
    if not found:
        return None
    shapes = Counter(name for _, name in found)
    return float(np.median([w for w, _ in found])), shapes.most_common(1)[0][0]


def _fit_shape(t: np.ndarray, x: np.ndarray, f: float, seconds: float
               ) -> tuple[float, str] | None:
    fine = 256
    idx = (((t - t[0]) * f % 1.0) * fine).astype(int) % fine
    cols = (idx[None, :] + np.arange(0, fine, fine // 64)[:, None]) % fine
    xd = detrend(x)
    best: tuple[float, float, str] | None = None  # (residual, scale, shape)
    for name, duty in _SHAPES:
        w = _shape(duty, fine)
        if seconds > 0:
            w = _averaged(w, seconds * f)
        m = w[cols]  # (shifts, samples)
        m = m - m.mean(axis=1, keepdims=True)
        norm = np.einsum("ij,ij->i", m, m)
        scale = (m @ xd) / np.where(norm > 0, norm, np.inf)
        resid = float(xd @ xd) - scale * (m @ xd)
        k = int(np.argmin(np.where(scale > 0, resid, np.inf)))
        if scale[k] > 0 and (best is None or resid[k] < best[0]):
            best = (float(resid[k]), float(scale[k]), name)
    return None if best is None else (best[1], best[2])
