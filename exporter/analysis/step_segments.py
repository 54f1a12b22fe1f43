"""Segment-aware step swings: the job's step rhythm, looked for only where it computes.

A window that straddles a pause (checkpoint, evaluation, data stall) is ruled
by the pause's edges: their broadband energy outweighs a small step swing
inside the compute phase.  So :func:`find_step_swing` first splits the node's
power into compute plateaus and pauses (a morphological closing fills the low
phases of a swing, so only real pauses remain), then analyses each plateau
long enough for the band and joins them:

- the plateaus (cut into pieces of at most 30 s) get Hann spectra (linear
  trend removed, one common fine grid), averaged; among the local peaks up to
  the observable band's edge that stand clear of their noise floor, the one
  with the most power is the candidate (a sub-harmonic with a real peak of its
  own is preferred, as in :mod:`exporter.analysis.spectrum`, unless the
  waveform folded at it merely repeats the faster one);
- **significance**: that peak over its noise floor (the running median of the
  averaged spectrum; for a towering peak, the median beyond its side lobes);
  **confidence**: 1 - the chance that noise alone puts a peak that high
  anywhere in the searched range (chi-squared, one pair of degrees of freedom
  per piece);
- **synchrony**: the GPUs' components at that frequency, plateau by plateau:
  |sum of the GPUs' components|^2 / (N * sum of their |component|^2), 1 in
  phase, about 1/N independent;
- **amplitude**: peak-to-peak of the node's mean step waveform, each plateau
  folded at the period and aligned by its own phase (the rhythm restarts after
  a pause);
- **duty**: the share of the analysed compute time whose pieces show the swing.

The swing is reported when it is clear (confidence), coherent (synchrony) and
periodic (it shows in at least half the compute time, and the edges seen agree
with the period where the swing stands out of the noise enough to count them).
Amplitude thresholds are not applied here: they decide what matters to the grid
(:func:`grid_relevant`), not what is seen.
Pure numpy; see docs/power.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from exporter.analysis.signal import (
    amplitude_share,
    detrend_rows,
    hann,
    median,
    parabolic,
    percentile,
    resample,
)
from exporter.analysis.spectrum import EDGE_RATIO, edge_frequencies, frequency_consistent, phases

MIN_CONFIDENCE = 0.9999  # at most one false swing in 10,000 noise-only analyses (in theory)
MIN_SYNCHRONY = 0.7  # coherent: well above the 1/N of independent GPUs
PAUSE_RATIO = 0.30  # a pause: the node's working level falls by this share of its top
FILL_SECONDS = 2.0  # gaps shorter than this are a swing's low phase, not a pause
TRIM_SECONDS = 1.5  # left out next to each pause edge (ramps, the sensor's average)
MIN_PLATEAU_SECONDS = 5.0
MIN_CYCLES = 3  # cycles of the slowest searched frequency in the longest plateau
MIN_DUTY = 0.5  # periodic: the peak shows on its own in at least half the compute time
PRESENT_SIGNIFICANCE = 4.0  # a plateau whose own spectrum shows the peak this far up
COUNTABLE_SHARE = 0.9  # the swing's share of a plateau's variance for its edges to count
PAD = 8  # zero-padding factor of the common spectral grid
REFINE_PAD = 32  # and of the untapered spectra the frequency is refined on
PIECE_SECONDS = 30.0  # longer plateaus are cut into pieces: more spectra to average
FLOOR_BINS = 15  # independent bins in the running median that is the noise floor
PROFILE_BINS = 24  # phase bins of the mean step waveform (divisible by 2, 3 and 4)
TOWER = 10.0  # a peak this many times the needed significance over the floor beyond it
REPEAT_CORRELATION = 0.7  # a waveform this alike to itself shifted by 1/m repeats m times
MIN_SAMPLES_PER_PERIOD = 8  # fewer: edges between samples cannot be counted


@dataclass(frozen=True)
class StepSwing:
    """A clear, coherent, periodic step swing found inside the compute plateaus."""

    frequency_hz: float
    amplitude_watts: float  # peak-to-peak of the node's mean step waveform
    amplitude_ratio: float | None  # of the node's summed power limit; None when unknown
    mean_watts: float  # the node's mean power over the plateaus
    synchrony: float  # coherence of the GPUs' components at the frequency, 0-1
    significance: float  # spectral peak / noise floor of the plateau-averaged spectrum
    confidence: float  # 1 - false-alarm probability of a peak that significant
    duty: float  # share of the analysed compute time whose plateaus show the swing
    phase_radians: float  # phi of cos(2 pi f (t - phase_reference_time) + phi), last plateau
    phase_reference_time: float
    plateaus: int  # plateaus analysed
    compute_seconds: float  # their total length
    edge_frequency_hz: float | None  # rising edges per second, where countable

    @property
    def period_seconds(self) -> float:
        return 1.0 / self.frequency_hz


@dataclass(frozen=True)
class SegmentAnalysis:
    """What :func:`find_step_swing` saw: the swing (None when none is clear) and why not."""

    swing: StepSwing | None
    plateaus: tuple[tuple[float, float], ...]  # (start, end) of each analysed plateau
    pause_seconds: float  # time the node spent in pauses
    reason: str | None = None  # why no swing is reported


def _running(x: np.ndarray, w: int, op: np.ufunc) -> np.ndarray:
    """Centred running max (op=np.maximum) or min over w samples, edges padded, in O(n):
    prefix and suffix extremes within blocks of w (van Herk, Gil and Werman)."""
    if w <= 1:
        return x.copy()
    n = x.size
    padded = np.pad(x, (w // 2, w - 1 - w // 2 + (-(n + w - 1)) % w), mode="edge")
    blocks = padded.reshape(-1, w)
    prefix = op.accumulate(blocks, axis=1).ravel()
    suffix = op.accumulate(blocks[:, ::-1], axis=1)[:, ::-1].ravel()
    return op(suffix[:n], prefix[w - 1:w - 1 + n])


def plateaus(node: np.ndarray, dt: float, *, pause_ratio: float = PAUSE_RATIO,
             fill_seconds: float = FILL_SECONDS, trim_seconds: float = TRIM_SECONDS,
             min_seconds: float = MIN_PLATEAU_SECONDS) -> tuple[list[tuple[int, int]], int]:
    """Compute plateaus of the node's power as index ranges [a, b), and the paused samples.

    The working level is the power with gaps shorter than ``fill_seconds`` filled
    (closing, as analysis.ramps.detect_dips); where it spans at least
    ``pause_ratio`` of its top, samples below the midpoint of its p5 and p95 are
    paused.  Each plateau loses ``trim_seconds`` next to a pause edge and must
    then last ``min_seconds``; so does each end of the window (it may cut
    through an edge).
    """
    n = node.size
    w = max(1, int(round(fill_seconds / dt)))
    level = _running(_running(node, w, np.maximum), w, np.minimum)
    lo, hi = percentile(level, [5, 95])
    if hi > 0 and hi - lo >= pause_ratio * hi:
        paused = level < (lo + hi) / 2
    else:
        paused = np.zeros(n, dtype=bool)
    trim = int(round(trim_seconds / dt))
    least = int(math.ceil(min_seconds / dt))
    out = []
    edges = np.flatnonzero(np.diff(paused.astype(np.int8))) + 1
    bounds = [0, *edges.tolist(), n]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        if paused[a]:
            continue
        # the window's own ends too: one may fall on an edge the closing could not see
        a2, b2 = a + trim, b - trim
        if b2 - a2 >= least:
            out.append((a2, b2))
    return out, int(paused.sum())


def _chi2_sf_even(nu: int, x: float) -> float:
    """P(chi-squared with an even nu degrees of freedom > x)."""
    half = x / 2
    term, total = 1.0, 1.0
    for k in range(1, nu // 2):
        term *= half / k
        total += term
    return min(1.0, math.exp(-half) * total)


def _false_alarm(significance: float, nu: int, independent_bins: float) -> float:
    """Chance that noise alone puts a peak ``significance`` times its median anywhere
    among ``independent_bins`` bins of an average of nu / 2 periodograms."""
    median_over_mean = (1 - 2 / (9 * nu)) ** 3  # Wilson-Hilferty, chi2 / nu
    per_bin = _chi2_sf_even(nu, nu * significance * median_over_mean)
    return min(1.0, -math.expm1(max(1.0, independent_bins) * math.log1p(-min(per_bin, 1 - 1e-16))))


def _pieces(ranges: list[tuple[int, int]], most: int) -> list[tuple[int, int]]:
    """Each range cut into equal pieces of at most ``most`` samples."""
    out = []
    for a, b in ranges:
        m = max(1, math.ceil((b - a) / max(1, most)))
        cuts = np.linspace(a, b, m + 1).round().astype(int).tolist()
        out += list(zip(cuts[:-1], cuts[1:], strict=True))
    return out


def _local_floor(s: np.ndarray, k_hi: int) -> np.ndarray:
    """The noise floor under each bin: the median of FLOOR_BINS independent bins (every
    PAD-th) around it, the window kept inside the spectrum (so a peak near either end is
    not mirrored into its own floor); a coloured noise (a sensor's average) is then judged
    against its own level, not the band's."""
    idx = np.arange(PAD, k_hi + 1, PAD)
    coarse = s[idx]
    m = coarse.size
    width = min(FLOOR_BINS, m)
    view = np.lib.stride_tricks.sliding_window_view(coarse, width)
    meds = median(view, axis=1)
    starts = np.clip(np.arange(m) - width // 2, 0, m - width)
    out = np.interp(np.arange(s.size), idx, meds[starts])
    return np.maximum(out, 1e-300)


def _refine(f: float, nodes: list[np.ndarray], fs: float, resolution: float) -> float:
    """The frequency near f (within the spectral resolution) that gathers most power at
    itself and its harmonics below half the sample rate, summed over the (detrended)
    pieces without a taper, read off one finely zero-padded FFT per piece: folding many
    cycles needs a period more exact than the tapered spectrum's peak gives."""
    harmonics = max(1, min(3, int(fs / 2 / f)))
    cands = f + np.linspace(-1.0, 1.0, 65) * resolution
    cands = cands[cands > 0]
    score = np.zeros(cands.size)
    for x in nodes:
        nfft = 1 << int(math.ceil(math.log2(REFINE_PAD * x.size)))
        power = np.abs(np.fft.rfft(x, nfft)) ** 2
        bins = np.arange(power.size)
        for h in range(1, harmonics + 1):
            score += np.interp(h * cands * nfft / fs, bins, power)
    return float(cands[int(np.argmax(score))])


def _profile_range(sums: np.ndarray, counts: np.ndarray) -> float:
    """Peak-to-peak of the mean waveform, lightly smoothed (three bins, circular, weighted
    by the samples in each) so the noise left in a bin does not add to the range; bins
    no sample fell in (a rate close to a multiple of the swing's) take no part."""
    s3 = np.roll(sums, 1) + sums + np.roll(sums, -1)
    c3 = np.roll(counts, 1) + counts + np.roll(counts, -1)
    prof = s3[c3 > 0] / c3[c3 > 0]
    return float(prof.max() - prof.min()) if prof.size else 0.0


def _significance_needed(nu: int, bins: float, confidence: float) -> float:
    """The smallest significance whose false-alarm probability is 1 - confidence."""
    lo, hi = 1.0, 1e4
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if 1.0 - _false_alarm(mid, nu, bins) < confidence else (lo, mid)
    return hi


def _repeats(nodes: list[np.ndarray], f: float, fs: float, m: int) -> bool:
    """Does the waveform folded at f repeat m times per period (each piece on its own)?
    Then f is not the swing's period but a fraction of it: harmonics of a fast swing folded
    by the sampling can land near f / m and fake a sub-harmonic."""
    score = weight = 0.0
    for x in nodes:
        u = (f * np.arange(x.size) / fs % 1.0 * PROFILE_BINS).astype(int) % PROFILE_BINS
        counts = np.bincount(u, minlength=PROFILE_BINS)
        prof = np.bincount(u, weights=x, minlength=PROFILE_BINS) / np.maximum(counts, 1)
        prof[counts == 0] = np.nan  # a rate near a multiple of f leaves phases unseen
        shifted = np.roll(prof, PROFILE_BINS // m)
        both = np.isfinite(prof) & np.isfinite(shifted)
        if both.sum() < 4:
            continue
        a, b = prof[both] - prof[both].mean(), shifted[both] - shifted[both].mean()
        norm = math.sqrt(float(a @ a) * float(b @ b))
        if norm > 0:
            score += float(a @ b) / norm * x.size
            weight += x.size
    return weight > 0 and score / weight >= REPEAT_CORRELATION


def _peak_floors(s: np.ndarray, ks: np.ndarray, k_nyq: int, skirt: int) -> np.ndarray:
    """The noise floor under peaks at bins ``ks``: the median of FLOOR_BINS independent bins
    on either side beyond the peak's skirt (a strong peak's side lobes would otherwise be
    its own floor and cap its significance)."""
    steps = skirt + PAD * np.arange(FLOOR_BINS)
    idx = np.concatenate([ks[:, None] - steps, ks[:, None] + steps], axis=1)
    ok = (idx >= PAD) & (idx <= k_nyq)
    vals = np.sort(np.where(ok, s[np.clip(idx, 0, s.size - 1)], np.inf), axis=1)
    n = ok.sum(axis=1)
    mid = np.maximum(n - 1, 0) // 2
    med = np.where(n > 0, (vals[np.arange(len(ks)), mid]
                           + vals[np.arange(len(ks)), np.maximum(n - 1, 0) - mid]) / 2, np.inf)
    return np.maximum(med, 1e-300)


def _peak(s: np.ndarray, k: int, clear: Callable[[int], bool], k_lo: int,
          nodes: list[np.ndarray], fs: float, nfft: int) -> int:
    """Bin k, or a sub-harmonic of it with a clear peak of its own (>= 30 % of its power)
    whose waveform does not merely repeat the faster one: a pulse train with a short duty
    cycle can put as much energy at 2f as at f."""
    half = PAD // 2  # half a resolution step: an aliased harmonic lies near k/m, not on it
    f_top: float | None = None  # refined when first needed (folding needs an exact period)
    for m in (4, 3, 2):
        ks = int(round(k / m))
        # looked for below the search's bottom too: a fundamental too slow for the plateaus
        # must not leave its harmonic reported as the swing (the caller says so instead)
        if ks - half < max(PAD, k_lo // 3):
            continue
        lo, hi = ks - half, ks + half
        kk = lo + int(np.argmax(s[lo:hi + 1]))
        if s[kk] >= 0.3 * s[k] and s[kk] >= s[kk - 1] and s[kk] >= s[kk + 1] and clear(kk):
            if f_top is None:
                f_top = _refine(k * fs / nfft, nodes, fs, fs / max(x.size for x in nodes))
            if not _repeats(nodes, f_top / m, fs, m):
                return kk
    return k


@dataclass
class _Peak:
    """The plateau-averaged spectrum and its candidate peak."""

    pieces: list[tuple[int, int]]
    segs: list[np.ndarray]  # each piece, every GPU, trend removed
    psd: np.ndarray  # (pieces, bins) of the node
    floor: np.ndarray  # the averaged spectrum's noise floor
    k: int  # the peak's bin
    f: float
    significance: float
    confidence: float
    resolution: float  # Hz: 1 / the longest piece


def _spectral_peak(x: np.ndarray, ranges: list[tuple[int, int]], fs: float, top: float,
                   min_hz: float, min_confidence: float) -> _Peak | str:
    """The candidate peak of the pieces' averaged spectrum, or why there is none."""
    pieces = _pieces(ranges, int(round(PIECE_SECONDS * fs)))
    lengths = np.array([b - a for a, b in pieces], dtype=float)
    longest = int(lengths.max())
    nfft = 1 << int(math.ceil(math.log2(PAD * longest)))
    k_lo = max(1, int(math.ceil(max(min_hz, MIN_CYCLES * fs / longest) * nfft / fs)))
    # the search runs up to the observable band's top: beyond it a sensor's average leaves
    # only its own nulls and side lobes (a peak at the band's edge is reported as
    # unresolved); the noise floor is taken up to half the sample rate
    k_nyq = nfft // 2 - 1
    k_hi = min(k_nyq, int(top * nfft / fs))
    if k_hi <= k_lo + PAD:
        return "plateaus too short for the band"
    segs = [detrend_rows(x[:, a:b]) for a, b in pieces]
    psd = np.empty((len(segs), nfft // 2 + 1))
    for i, seg in enumerate(segs):
        w = hann(seg.shape[1])
        psd[i] = np.abs(np.fft.rfft(seg.sum(axis=0) * w, nfft)) ** 2 / float(w @ w)
    s = (lengths[:, None] * psd).sum(axis=0) / lengths.sum()
    floor = _local_floor(s, k_nyq)
    nu = max(2, 2 * int(round(lengths.sum() ** 2 / float((lengths ** 2).sum()))))
    # the fine grid's peaks fall between independent bins too: count each twice
    bins = 2 * (k_hi - k_lo) / PAD
    needed = _significance_needed(nu, bins, min_confidence)
    # a peak's own skirt (its shortest piece's main lobe and first side lobes) is no floor
    skirt = max(PAD, int(math.ceil(4 * nfft / lengths.min())))

    def significance_at(ks: np.ndarray) -> np.ndarray:
        # against the running floor; a strong peak's skirt inflates that floor and caps
        # its figure, so against the floor beyond the skirt too, but only where the peak
        # towers over it (beyond the skirt a coloured noise can be lower than under it)
        ordinary = s[ks] / floor[ks]
        beyond = s[ks] / _peak_floors(s, ks, k_nyq, skirt)
        return np.where(beyond >= TOWER * needed, np.maximum(ordinary, beyond), ordinary)

    # the strongest (in watts) of the peaks that stand clear of their noise floor: the
    # significance says what is real, the power which of those dominates
    band = s[k_lo - 1:k_hi + 2]
    tops = np.flatnonzero((band[1:-1] >= band[:-2]) & (band[1:-1] > band[2:])) + k_lo
    if tops.size == 0:  # rising or falling across the whole band: its strongest end
        tops = np.array([k_lo + int(np.argmax(s[k_lo:k_hi + 1]))])
    sig = significance_at(tops)
    clear = tops[sig >= needed]
    k = int(clear[np.argmax(s[clear])]) if clear.size else int(tops[np.argmax(sig)])
    k = _peak(s, k, lambda kk: float(significance_at(np.array([kk]))[0]) >= needed, k_lo,
              [seg.sum(axis=0) for seg in segs], fs, nfft)
    if not s[k] > 0:
        return "flat power"
    ls = np.log(s[k - 1:k + 2] + 1e-300).tolist()
    f = (k + parabolic(ls[0], ls[1], ls[2])) * fs / nfft
    if f >= EDGE_RATIO * top:
        return f"the strongest periodicity ({f:.3g} Hz) lies at the observable band's edge: " \
               "unresolved"
    if k < k_lo:
        return f"the swing's period ({nfft / fs / k:.3g} s) is too long for the plateaus " \
               f"(three cycles need {MIN_CYCLES * nfft / fs / k:.3g} s)"
    significance = float(significance_at(np.array([k]))[0])
    confidence = 1.0 - _false_alarm(significance, nu, bins)
    if confidence < min_confidence:
        return f"no clear periodic swing (confidence {confidence:.3g})"
    return _Peak(pieces, segs, psd, floor, k, f, significance, confidence, fs / longest)


@dataclass
class _Components:
    """The swing's components at its frequency, gathered piece by piece."""

    coherent: float = 0.0  # sum of |the GPUs' components added|^2
    total: float = 0.0  # sum of the GPUs' |component|^2
    present: float = 0.0  # samples in pieces that show the peak
    phase: float = 0.0  # the last piece's
    sums: np.ndarray = field(default_factory=lambda: np.zeros(PROFILE_BINS))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(PROFILE_BINS))
    edges: list[float] = field(default_factory=list)


def _components(pk: _Peak, grid: np.ndarray, raw_t: np.ndarray, raw_node: np.ndarray,
                fs: float, t_ref: float) -> _Components:
    """Synchrony, phase, presence, the folded waveform and the edges, at pk.f."""
    out = _Components()
    f, k = pk.f, pk.k
    countable = fs / f >= MIN_SAMPLES_PER_PERIOD
    for (a, b), seg, p in zip(pk.pieces, pk.segs, pk.psd, strict=True):
        tr = grid[a:b] - t_ref
        c = (hann(seg.shape[1]) * seg * np.exp(-2j * np.pi * f * tr)).sum(axis=1)
        out.coherent += float(abs(c.sum()) ** 2)
        out.total += float((np.abs(c) ** 2).sum())
        node_seg = seg.sum(axis=0)
        phi = phases(node_seg[None, :], tr, f)[0]
        out.phase = phi
        if (p[k - PAD:k + PAD + 1] / pk.floor[k - PAD:k + PAD + 1]).max() \
                >= PRESENT_SIGNIFICANCE:
            out.present += b - a
        keep = (raw_t >= grid[a]) & (raw_t <= grid[b - 1])
        rt, rx = raw_t[keep] - t_ref, raw_node[keep]
        if rt.size >= 4:
            u = rt - rt.mean()
            rx = rx - rx.mean() - u * (float(u @ rx) / float(u @ u))
        else:
            rt, rx = tr, node_seg
        u = ((f * rt + phi / (2 * np.pi)) % 1.0 * PROFILE_BINS).astype(int) % PROFILE_BINS
        bin_sums = np.bincount(u, weights=rx, minlength=PROFILE_BINS)
        bin_counts = np.bincount(u, minlength=PROFILE_BINS)
        out.sums += bin_sums
        out.counts += bin_counts
        prof = bin_sums / np.maximum(bin_counts, 1)
        # edges only count where the swing stands out of the noise, between enough samples
        if countable and float(prof.var()) >= COUNTABLE_SHARE * float(rx.var()):
            p5, p95 = percentile(rx, [5, 95])
            e = edge_frequencies(rx[None, :], fs, np.array([p5]), np.array([p95]))[0]
            if e is not None:
                out.edges.append(e)
    return out


def find_step_swing(
    t: np.ndarray,
    power: np.ndarray,
    tdp_watts: np.ndarray | None = None,
    *,
    observable_hz: float | None = None,
    min_hz: float = 0.1,
    min_synchrony: float = MIN_SYNCHRONY,
    min_confidence: float = MIN_CONFIDENCE,
    phase_grid_seconds: float = 10.0,
) -> SegmentAnalysis:
    """The step swing inside the compute plateaus of a node's power (see the module doc).

    ``t``: sample times (Unix seconds); ``power``: (N, len(t)) watts per GPU,
    NaN where missing (a GPU with fewer than two readings is left out);
    ``tdp_watts``: (N,) power limits or None; ``observable_hz``: the band's
    top (default: half the sample rate).  A peak at or above 90 % of it is not a
    resolvable frequency and gives no swing.
    """
    power = np.atleast_2d(np.asarray(power, dtype=np.float64))
    t = np.asarray(t, dtype=np.float64)
    if t.ndim != 1 or t.size < 8:
        raise ValueError("need at least 8 samples")
    grid, x = resample(t, power)
    ok = np.isfinite(x).all(axis=1)
    x = x[ok]
    if x.shape[0] == 0:
        return SegmentAnalysis(None, (), 0.0, "no GPU has power readings")
    dt = float(grid[1] - grid[0])
    fs = 1.0 / dt
    top = min(observable_hz, fs / 2) if observable_hz else fs / 2
    node = x.sum(axis=0)
    ranges, paused = plateaus(node, dt)
    spans = tuple((float(grid[a]), float(grid[b - 1])) for a, b in ranges)
    if not ranges:
        return SegmentAnalysis(None, spans, paused * dt, "no compute plateau long enough")
    pk = _spectral_peak(x, ranges, fs, top, min_hz, min_confidence)
    if isinstance(pk, str):
        return SegmentAnalysis(None, spans, paused * dt, pk)
    t_ref = math.floor(grid[-1] / phase_grid_seconds) * phase_grid_seconds
    pk.f = _refine(pk.f, [seg.sum(axis=0) for seg in pk.segs], fs, pk.resolution)
    # the node at its own sample times, for the waveform: a grid between jittered samples
    # interpolates across a fast swing's peaks
    raw_ok = np.isfinite(power[ok]).all(axis=0)
    comp = _components(pk, grid, t[raw_ok], power[ok][:, raw_ok].sum(axis=0), fs, t_ref)
    sync = comp.coherent / (x.shape[0] * comp.total) if comp.total > 0 else 0.0
    edge_hz = float(median(comp.edges)) if comp.edges else None
    # coherent: past the threshold and well past the 1/N of independent GPUs (for two
    # GPUs, one swinging alone gives 1/2)
    if x.shape[0] > 1 and sync < max(min_synchrony, 1.5 / x.shape[0]):
        return SegmentAnalysis(None, spans, paused * dt,
                               f"the GPUs swing independently (synchrony {sync:.2f})")
    analysed = sum(b - a for a, b in pk.pieces)
    if comp.present < MIN_DUTY * analysed:
        return SegmentAnalysis(None, spans, paused * dt,
                               f"the peak shows in only {100 * comp.present / analysed:.0f} % "
                               "of the compute time, not throughout")
    if not frequency_consistent(pk.f, edge_hz):
        return SegmentAnalysis(None, spans, paused * dt,
                               f"the edges seen ({edge_hz:.3g} /s) disagree with the spectrum's "
                               f"period ({1 / pk.f:.3g} s)")
    amp = _profile_range(comp.sums, comp.counts)
    tdp = None if tdp_watts is None else np.asarray(tdp_watts, dtype=float).reshape(-1)[ok]
    node_tdp = float(tdp.sum()) if tdp is not None and np.isfinite(tdp).all() else None
    swing = StepSwing(
        frequency_hz=float(pk.f), amplitude_watts=amp,
        amplitude_ratio=amp / node_tdp if node_tdp else None,
        mean_watts=float(np.mean(np.concatenate([node[a:b] for a, b in pk.pieces]))),
        synchrony=float(min(1.0, sync)), significance=pk.significance,
        confidence=pk.confidence, duty=comp.present / analysed,
        phase_radians=float(comp.phase), phase_reference_time=float(t_ref),
        plateaus=len(ranges), compute_seconds=analysed * dt, edge_frequency_hz=edge_hz)
    return SegmentAnalysis(swing, spans, paused * dt)


def grid_relevant(swing: StepSwing, min_amplitude_ratio: float,
                  band_hz: tuple[float, float]) -> bool:
    """Does the swing matter to the grid: its amplitude past the threshold (of the power
    limit; of the observed peak when that is unknown) and its frequency in the band."""
    ratio = amplitude_share(swing.amplitude_watts, swing.mean_watts, swing.amplitude_ratio)
    return ratio >= min_amplitude_ratio and band_hz[0] <= swing.frequency_hz <= band_hz[1]
