"""analyze's power swings: windows slid over a trace, merged into reported patterns.

- **window swings**, at the step scale (analysis.power_swing.analyse_window): runs
  of at least ``hold`` candidate windows with the same dominant frequency (within 10 %) whose
  period agrees with the edges seen (spectrum.frequency_consistent);
- **window swings, unresolved**: runs of windows whose dominant periodicity lies at or
  above the observable band's top (or whose spectrum and edges disagree):
  reported as "above N Hz, unresolved", never as a lesser, slower peak;
- **step swings**, inside the compute plateaus (analysis.step_segments.find_step_swing):
  windows of ``--segment-window`` seconds, each split into compute plateaus and
  pauses; every clear, coherent, periodic swing is reported, with
  ``grid_relevant`` saying whether it passes ``--min-amplitude-ratio`` and the
  band (the thresholds decide what matters, not what is seen);
- **cycle** (analysis.cycles.analyse_cycles): slow periodic patterns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from exporter.analysis.averaging import source_swing
from exporter.analysis.bridging import Bridge, usable
from exporter.analysis.power_swing import (
    CycleFeatures,
    NodeSwing,
    SwingThresholds,
    analyse_cycles,
    analyse_window,
)
from exporter.analysis.signal import amplitude_share, stretch_starts
from exporter.analysis.spectrum import EDGE_RATIO, frequency_consistent
from exporter.analysis.step_segments import StepSwing, find_step_swing, grid_relevant
from exporter.offline.band import AVERAGED, UNKNOWN, BandDecision
from exporter.offline.gaps import Gap
from exporter.offline.request import AnalyzeRequest

FREQ_TOLERANCE = 0.10  # windows within 10 % of a pattern's frequency belong to it
W = TypeVar("W")  # what a window found: a swing or a cycle
MIN_STEP_SAMPLES = 16  # fewer samples per step window cannot show a swing's shape
UNRESOLVED_MIN_CONCENTRATION = 0.5  # a real periodic component, not noise
SPARSE_SAMPLES_PER_PERIOD = 10  # fewer: p95 - p5 can miss a swing's peaks


@dataclass
class Grid:
    """Every GPU's power on one uniform time grid (what the analysers read)."""

    t: np.ndarray  # uniform, Unix seconds
    power: np.ndarray  # (N, M) watts
    gpus: list[int]
    dt: float
    tdp: np.ndarray  # (N,) NaN where unknown
    # the node's power at the first GPU's own sample times (exact for nvidia-smi logs,
    # whose GPUs share each poll's time): interpolating onto the grid blurs sharp edges
    raw_t: np.ndarray | None = None
    raw_node: np.ndarray | None = None
    # the gaps in the samples (exporter.offline.gaps); per grid point, whether it is
    # measured (False: interpolated across a gap), for the node and per GPU; None: no gaps
    gaps: list[Gap] = field(default_factory=list)
    valid: np.ndarray | None = None
    measured: np.ndarray | None = None  # (N, M)
    # each analysis' bridge over the gaps (analysis.bridging), by name
    bridges: dict[str, Bridge] = field(default_factory=dict)

    @property
    def node_tdp(self) -> float | None:
        return float(self.tdp.sum()) if np.isfinite(self.tdp).all() else None

    def holes(self) -> list[tuple[float, float]]:
        return [(g.start, g.end) for g in self.gaps]

    def usable(self, b: Bridge | None) -> np.ndarray | None:
        """False inside the gaps the bridge does not span (every gap without one);
        None: no gaps."""
        if not self.gaps:
            return None
        return usable(self.t, self.holes(), b) if b is not None else self.valid

    def clean_seconds(self, b: Bridge | None = None) -> float:
        """The longest stretch of the grid without a gap that the bridge leaves unbridged
        (the whole span without gaps)."""
        ok = self.usable(b)
        if ok is None or ok.all():
            return float(self.t[-1] - self.t[0])
        edges = np.diff(np.concatenate([[0], ok.astype(np.int8), [0]]))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
        if starts.size == 0:
            return 0.0
        return float((self.t[ends] - self.t[starts]).max())

    def window_starts(self, starts: list[int], n_win: int, n_step: int, *, tail: bool,
                      b: Bridge) -> list[int | None]:
        """``starts`` as they are without gaps; with gaps, windows laid within each
        stretch between the gaps the bridge does not span (analysis.signal.stretch_starts),
        None at such a gap and for a window the bridged gaps fill too much of: none is
        analysed across what its analysis cannot bridge."""
        ok = self.usable(b)
        if ok is None:
            return list(starts)
        holes, m = self.holes(), self.t.size
        return [a if a is not None and b.window_ok(
            holes, float(self.t[a]), float(self.t[min(m, a + n_win) - 1])) else None
            for a in stretch_starts(ok, n_win, n_step, tail=tail)]


Window = tuple[float, float, NodeSwing]


def _med(values: Sequence[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.median(v)) if v else None


def _pattern_runs(windows: Iterable[tuple[float, float, W | None]],
                  scale: Callable[[W], float]) -> list[list[tuple[float, float, W]]]:
    """Consecutive windows that found a pattern at one scale (frequency or period, within
    FREQ_TOLERANCE): a window without one, or at another scale, ends a run."""
    runs: list[list[tuple[float, float, W]]] = []
    cur: list[tuple[float, float, W]] = []
    for a, b, found in windows:
        if cur and (found is None or abs(scale(found) - scale(cur[-1][2]))
                    > FREQ_TOLERANCE * scale(found)):
            runs.append(cur)
            cur = []
        if found is not None:
            cur.append((a, b, found))
    if cur:
        runs.append(cur)
    return runs


def swing_windows(g: Grid, req: AnalyzeRequest, band: BandDecision
                 ) -> list[tuple[float, float, NodeSwing | None]]:
    """analyse_window over windows of --window seconds every --step seconds (None for a
    window that straddles a gap: left out, and it ends a run)."""
    n_win = max(4, int(round(req.power.window_seconds / g.dt)))
    n_step = max(1, int(round((req.step or req.power.window_seconds / 3) / g.dt)))
    th = req.power.swing_thresholds()
    tdp = g.tdp if np.isfinite(g.tdp).all() else None
    m = g.t.size
    out: list[tuple[float, float, NodeSwing | None]] = []
    for a in g.window_starts(list(range(0, max(1, m - n_win + 1), n_step)), n_win, n_step,
                             tail=False, b=g.bridges["step"]):
        if a is None:  # a gap between two stretches: ends a run
            out.append((math.nan, math.nan, None))
            continue
        b = min(m, a + n_win)
        ns = analyse_window(g.t[a:b], g.power[:, a:b], tdp, req.power.band_hz, gpus=g.gpus,
                            max_observable_hz=band.observable_hz, thresholds=th)
        out.append((float(g.t[a]), float(g.t[b - 1]), ns))
    return out


def classify(ns: NodeSwing | None, th: SwingThresholds) -> str | None:
    """"step" (a resolved swing), "unresolved", or None (no swing in this window, or a
    window left out)."""
    if ns is None:
        return None
    n = ns.node
    if ns.candidate and n.frequency_hz is not None:
        return "step" if frequency_consistent(n.frequency_hz, n.edge_frequency_hz) \
            else "unresolved"
    # beyond the band a swing arrives attenuated (averaging) or folded (sampling):
    # a quarter of the amplitude threshold, but a clear periodic component
    strong = (ns.synchrony >= th.min_synchrony
              and amplitude_share(n.amplitude_watts, n.mean_watts, n.amplitude_ratio)
              >= th.min_amplitude_ratio / 4
              and n.peak_concentration >= UNRESOLVED_MIN_CONCENTRATION)
    return "unresolved" if strong and n.unresolved else None


def _runs(windows: list[tuple[float, float, NodeSwing | None]], kinds: list[str | None],
          want: str, hold: int) -> list[list[Window]]:
    """Runs of >= hold consecutive windows of kind ``want``; a resolved run also
    breaks where the frequency moves by more than 10 %."""
    runs: list[list[Window]] = []
    cur: list[Window] = []
    for (a, b, ns), kind in zip(windows, kinds, strict=True):
        if kind != want or ns is None:
            if len(cur) >= hold:
                runs.append(cur)
            cur = []
            continue
        w = (a, b, ns)
        f = ns.node.frequency_hz
        if cur and want == "step":
            f_ref = float(np.median([c[2].node.frequency_hz for c in cur]))
            assert f is not None
            if abs(f - f_ref) > FREQ_TOLERANCE * f_ref:
                if len(cur) >= hold:
                    runs.append(cur)
                cur = []
        cur.append(w)
    if len(cur) >= hold:
        runs.append(cur)
    return runs


def window_swings(g: Grid, req: AnalyzeRequest, band: BandDecision, t_start: float
                  ) -> tuple[list[dict[str, Any]], int]:
    """Resolved and unresolved window swings, and the number of windows analysed (those
    that straddle a gap are not)."""
    windows = swing_windows(g, req, band)
    th = req.power.swing_thresholds()
    kinds = [classify(w[2], th) for w in windows]
    node = g.power.sum(axis=0)
    out = []
    for run in _runs(windows, kinds, "step", req.power.hold_updates):
        f = _med([w[2].node.frequency_hz for w in run])
        assert f is not None
        start, end = _swing_edges(g.t, node, run[0][0], run[-1][1], 1.0 / f)
        entry = _step_entry(run, f, start - t_start, end - t_start, band)
        # through an average, or with too few samples per period for p95 - p5 to catch
        # the peaks, fit the swing's shape to the samples (analysis.averaging.source_swing)
        avg = band.seconds if band.kind == AVERAGED and band.seconds else 0.0
        if avg or f * g.dt > 1 / SPARSE_SAMPLES_PER_PERIOD:
            rt, rx = (g.raw_t, g.raw_node) if g.raw_t is not None else (g.t, node)
            assert rx is not None  # the raw node series comes with the raw times
            keep = (rt >= start) & (rt <= end)
            found = source_swing(rt[keep], rx[keep], f, avg)
            if found is not None:
                entry["source_amplitude_watts"], entry["source_shape"] = found
        out.append(entry)
    for run in _runs(windows, kinds, "unresolved", req.power.hold_updates):
        out.append(_unresolved_entry(run, band, run[0][0] - t_start, run[-1][1] - t_start))
    out.sort(key=lambda s: s["start"])
    return out, sum(1 for w in windows if w[2] is not None)


def _common(run: list[Window], start: float, end: float) -> dict[str, Any]:
    return {
        "node_amplitude_watts": _med([w[2].node.amplitude_watts for w in run]),
        "amplitude_ratio": _med([w[2].node.amplitude_ratio for w in run]),
        "synchrony": _med([w[2].synchrony for w in run]),
        "band_energy_ratio": _med([w[2].node.band_energy_ratio for w in run]),
        "duty_cycle": _med([w[2].node.duty_cycle for w in run]),
        "max_ramp_watts_per_second": max(w[2].node.max_ramp_watts_per_second for w in run),
        "windows": len(run),
        "start": start,
        "end": end,
    }


def _step_entry(run: list[Window], f: float, start: float, end: float, band: BandDecision
                ) -> dict[str, Any]:
    entry: dict[str, Any] = {"scale": "step", "resolved": True, "frequency_hz": f,
                             "period_seconds": 1.0 / f, **_common(run, start, end)}
    entry["edge_frequency_hz"] = _med([w[2].node.edge_frequency_hz for w in run])
    amp = entry["node_amplitude_watts"]
    avg = band.seconds if band.kind == AVERAGED else (1.0 if band.kind == UNKNOWN else None)
    if avg and amp is not None:
        # through a T-second average a square swing keeps its range up to 0.5/T Hz,
        # a sine loses a factor sinc(f T): the swing at the GPUs lies in between
        entry["source_amplitude_range_watts"] = [
            amp, amp / max(0.3, abs(float(np.sinc(f * avg))))]
    entry["aliasing_possible"] = band.aliasing_possible and band.kind != AVERAGED
    return entry


def _unresolved_entry(run: list[Window], band: BandDecision, start: float, end: float
                      ) -> dict[str, Any]:
    apparent = [w[2].node.apparent_frequency_hz for w in run]
    f_app = _med(apparent)
    if f_app is not None and any(a is None or abs(a - f_app) > FREQ_TOLERANCE * f_app
                                 for a in apparent):
        f_app = None  # no steady apparent frequency either
    above = EDGE_RATIO * band.observable_hz
    beyond = f_app is not None and f_app >= above
    reason = (f"the dominant periodicity lies above {above:.3g} Hz, the observable band's "
              "edge" if beyond or f_app is None else
              "the spectrum's period and the edges seen disagree")
    return {"scale": "step", "resolved": False, "frequency_hz": None, "period_seconds": None,
            "above_hz": above, "apparent_frequency_hz": f_app if beyond else None,
            "reason": reason, **_common(run, start, end), "amplitude_is_lower_bound": True}


def _swing_edges(t: np.ndarray, node: np.ndarray, t_a: float, t_b: float, period: float
                 ) -> tuple[float, float]:
    """Trim a run of windows to where the swing is: the node's peak-to-peak over
    one period (its envelope) is at least half its median over the run."""
    a, b = int(np.searchsorted(t, t_a)), int(np.searchsorted(t, t_b, side="right"))
    dt = float(t[1] - t[0])
    k = max(2, int(round(period / dt)))
    x = node[a:b]
    if x.size <= k:
        return t_a, t_b
    view = np.lib.stride_tricks.sliding_window_view(x, k)
    env = view.max(axis=1) - view.min(axis=1)
    hit = np.flatnonzero(env >= 0.5 * np.median(env))
    if hit.size == 0:
        return t_a, t_b
    # a window [i, i + k) that reaches the threshold ends just after the swing began
    return float(t[a + hit[0] + k - 1]), float(t[min(b - 1, a + hit[-1] + k - 1)])


def folded_swing(g: Grid, req: AnalyzeRequest, band: BandDecision, t_start: float
                 ) -> dict[str, Any] | None:
    """For samples too sparse for the swing windows: does the node jump between levels
    from one reading to the next, as much as over the whole trace?

    That is a swing faster than the samples, folded into them (mean squared
    step / twice the variance near 1, as for white noise; a slow pattern gives
    near 0).  Reported as an unresolved swing at the step scale, never as a frequency.
    """
    node = g.power.sum(axis=0)
    # steps from one reading to the next, none across a gap
    steps = np.diff(node) if g.valid is None else np.diff(node)[g.valid[1:] & g.valid[:-1]]
    if g.valid is not None:
        node = node[g.valid]
    if node.size < 8 or steps.size < 7:
        return None
    var = float(node.var())
    p5, p95 = np.percentile(node, [5, 95])
    amp = float(p95 - p5)
    ref = g.node_tdp or float(p95)
    if var <= 0 or ref <= 0 or amp / ref < req.power.min_amplitude_ratio:
        return None
    roughness = float(np.mean(steps ** 2)) / (2 * var)
    if roughness < 0.5:
        return None
    above = 0.5 / g.dt
    return {"scale": "step", "resolved": False, "frequency_hz": None, "period_seconds": None,
            "above_hz": above, "apparent_frequency_hz": None,
            "reason": f"the node's power jumps between levels from one reading to the next "
                      f"(roughness {roughness:.2f}): a swing faster than the samples show is "
                      "folded into them",
            "node_amplitude_watts": amp, "amplitude_ratio": amp / g.node_tdp
            if g.node_tdp else None, "synchrony": None, "band_energy_ratio": None,
            "duty_cycle": None, "max_ramp_watts_per_second": None, "windows": 0,
            "start": 0.0, "end": float(g.t[-1] - t_start), "amplitude_is_lower_bound": True}


def drop_beats(cycles: list[dict[str, Any]], steps: list[dict[str, Any]]
               ) -> tuple[list[dict[str, Any]], list[str]]:
    """Cycles whose period is a whole multiple of an overlapping window swing's are the
    window swing seen through the sampling (a beat), not a pattern of their own."""
    kept, notes = [], []
    for c in cycles:
        # a swing found inside the compute plateaus is no beat of the samples with a pause
        beat = next((s for s in steps if s.get("period_seconds")
                     and s.get("method") != "segments" and s["start"] < c["end"]
                     and s["end"] > c["start"] and _multiple(c["period_seconds"],
                                                             s["period_seconds"])), None)
        if beat is None:
            kept.append(c)
        else:
            notes.append(f"a {c['period_seconds']:.1f} s cycle is a whole multiple of the "
                         f"{beat['period_seconds']:.2f} s window swing's period: the "
                         "window swing beating with the samples, not reported as a cycle")
    return kept, notes


def _multiple(long: float, short: float) -> bool:
    k = round(long / short)
    return k >= 1 and abs(long / short - k) <= 0.03 * k


# --------------------------------------------------------------------------- step, segments


def segment_windows(g: Grid, req: AnalyzeRequest, band: BandDecision
                    ) -> list[tuple[float, float, StepSwing | None]]:
    """find_step_swing over windows of --segment-window seconds, every half window (the
    last one ends with the trace, as the live monitor's last window does)."""
    n_win = max(8, int(round(req.power.segment_window_seconds / g.dt)))
    n_step = max(1, n_win // 2)
    m = g.t.size
    starts = list(range(0, max(1, m - n_win + 1), n_step))
    if starts[-1] + n_win < m:
        starts.append(m - n_win)
    tdp = g.tdp if np.isfinite(g.tdp).all() else None
    out: list[tuple[float, float, StepSwing | None]] = []
    for a in g.window_starts(starts, n_win, n_step, tail=True, b=g.bridges["segments"]):
        if a is None:  # a gap between two stretches: ends a run
            out.append((math.nan, math.nan, None))
            continue
        b = min(m, a + n_win)
        if b - a < 8:
            continue
        res = find_step_swing(g.t[a:b], g.power[:, a:b], tdp, observable_hz=band.observable_hz,
                              min_hz=req.power.band_hz[0])
        out.append((float(g.t[a]), float(g.t[b - 1]), res.swing))
    return out


def segment_swings(g: Grid, req: AnalyzeRequest, band: BandDecision, t_start: float
                   ) -> list[dict[str, Any]]:
    """Runs of windows whose plateaus show a step swing at one frequency (within 10 %),
    joined into one entry each (medians over the run)."""
    out = []
    for run in _pattern_runs(segment_windows(g, req, band), lambda sw: sw.frequency_hz):
        sws = [w[2] for w in run]
        f = _med([s.frequency_hz for s in sws])
        assert f is not None
        best = max(sws, key=lambda s: s.confidence)
        entry: dict[str, Any] = {
            "scale": "step", "resolved": True, "method": "segments",
            "frequency_hz": f, "period_seconds": 1.0 / f,
            "node_amplitude_watts": _med([s.amplitude_watts for s in sws]),
            "amplitude_ratio": _med([s.amplitude_ratio for s in sws]),
            "mean_watts": _med([s.mean_watts for s in sws]),
            "synchrony": _med([s.synchrony for s in sws]),
            "significance": _med([s.significance for s in sws]),
            "confidence": best.confidence,
            "duty": _med([s.duty for s in sws]),
            "plateaus": sum(s.plateaus for s in sws),
            "windows": len(run),
            "start": run[0][0] - t_start,
            "end": run[-1][1] - t_start,
        }
        joined = StepSwing(f, entry["node_amplitude_watts"], entry["amplitude_ratio"],
                           entry["mean_watts"], entry["synchrony"], entry["significance"],
                           best.confidence, entry["duty"], 0.0, 0.0, 0, 0.0, None)
        entry["grid_relevant"] = grid_relevant(joined, req.power.min_amplitude_ratio,
                                               req.power.band_hz)
        out.append(entry)
    return out


def merge_step_swings(windowed: list[dict[str, Any]], segments: list[dict[str, Any]]
                      ) -> list[dict[str, Any]]:
    """The window swings (grid-relevant: they passed the thresholds) and the step swings
    found in the plateaus; a step swing that a window swing already reports (overlapping,
    same frequency within 10 %) adds its significance and duty to it instead."""
    out = [dict(s, grid_relevant=True) if s.get("resolved") else dict(s) for s in windowed]
    for seg in segments:
        same = next((s for s in out if s.get("resolved") and s["scale"] == "step"
                     and s.get("method") != "segments" and s["start"] < seg["end"]
                     and s["end"] > seg["start"]
                     and abs(s["frequency_hz"] - seg["frequency_hz"])
                     <= FREQ_TOLERANCE * seg["frequency_hz"]), None)
        if same is None:
            out.append(seg)
        else:
            for key in ("significance", "confidence", "duty", "plateaus"):
                same[key] = seg[key]
    out.sort(key=lambda s: s["start"])
    return out


# --------------------------------------------------------------------------- cycle scale


def _cycle_windows(g: Grid, req: AnalyzeRequest
                   ) -> list[tuple[float, float, CycleFeatures | None]]:
    br = g.bridges["cycle"]
    span = g.clean_seconds(br)  # a window as long as the trace would straddle its gaps
    win = min(req.power.cycle_window_seconds, span)
    n_win = int(round(win / g.dt))
    n_step = max(1, int(round(win / 4 / g.dt)))
    m = g.t.size
    starts = list(range(0, max(1, m - n_win), n_step))
    if starts[-1] + n_win < m:
        starts.append(m - n_win)
    tdp = g.tdp if np.isfinite(g.tdp).all() else None
    out: list[tuple[float, float, CycleFeatures | None]] = []
    for a in g.window_starts(starts, n_win, n_step, tail=True, b=br):
        if a is None:  # a gap between two stretches: ends a run
            out.append((math.nan, math.nan, None))
            continue
        b = min(m, a + n_win)
        c = analyse_cycles(g.t[a:b], g.power[:, a:b], tdp,
                           measured=None if g.valid is None else g.valid[a:b])
        if c is not None and not _bridged_at(g, br, c.period_seconds, a, b):
            c = None
        if c is not None:
            ratio = c.amplitude_ratio
            if ratio is None:  # no TDP: compare with the window's peak node power
                peak = float(np.percentile(g.power[:, a:b].sum(axis=0), 95))
                ratio = c.amplitude_watts / peak if peak > 0 else 0.0
            if ratio < req.power.cycle_min_ratio:
                c = None
        out.append((float(g.t[a]), float(g.t[b - 1]), c))
    return out


def _bridged_at(g: Grid, br: Bridge, period: float, a: int, b: int) -> bool:
    """Whether every gap in the window [a, b) is bridged at the scale of the period found
    (its share of the period): a longer one could hide a cycle that fast."""
    longest = max((min(h.end, g.t[b - 1]) - max(h.start, g.t[a]) for h in g.gaps
                   if h.start < g.t[b - 1] and h.end > g.t[a]), default=0.0)
    return br.bridges_at(period, longest)


def cycle_swings(g: Grid, req: AnalyzeRequest, t_start: float) -> list[dict[str, Any]]:
    out = []
    for run in _pattern_runs(_cycle_windows(g, req), lambda c: c.period_seconds):
        period = _med([w[2].period_seconds for w in run])
        assert period is not None and period > 0 and math.isfinite(period)
        out.append({
            "scale": "cycle",
            "resolved": True,
            "frequency_hz": 1.0 / period,
            "period_seconds": period,
            "node_amplitude_watts": _med([w[2].amplitude_watts for w in run]),
            "amplitude_ratio": _med([w[2].amplitude_ratio for w in run]),
            "synchrony": _med([w[2].synchrony for w in run]),
            "strength": _med([w[2].strength for w in run]),
            "duty_cycle": _med([w[2].duty_cycle for w in run]),
            "max_ramp_watts_per_second": max(w[2].max_ramp_watts_per_second for w in run),
            "windows": len(run),
            "start": run[0][0] - t_start,
            "end": run[-1][1] - t_start,
        })
    return out
