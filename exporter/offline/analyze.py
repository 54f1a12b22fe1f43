"""`cluster-telemetry-exporter analyze FILE`: offline power and straggler analysis of a trace.

Reads an nvidia-smi CSV log or a cte recording (exporter.offline.trace), then:

- slides the step window (default 30 s, every 10 s) over the node's power and
  keeps runs of at least ``--hold`` consecutive windows that meet the swing
  thresholds with the same dominant frequency (within 10 %): scale ``step``;
- slides the cycle window (default 10 min, every 150 s) to find slow periodic
  patterns (checkpoints, evaluation): scale ``cycle``;
- finds large synchronised rises and falls of the node's power (``ramps``);
- slides the straggler window (default 60 s, every 10 s) to compare each GPU
  with its peers (``outliers``: deviations that held for ``--persistence``) and
  a short window (default 2 s) for the stall signature (``stalls``: peers
  busy-waiting while a culprit idles or still computes); see docs/stragglers.md.

Also runnable as ``python -m exporter.offline.analyze FILE``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exporter.analysis.power_swing import (
    CycleFeatures,
    NodeSwing,
    SwingThresholds,
    analyse_cycles,
    analyse_window,
    detect_ramps,
)
from exporter.analysis.straggler import StragglerThresholds
from exporter.analysis.straggler_scan import ScanResult, scan
from exporter.gpu import gpm
from exporter.offline.trace import Trace, TraceError, load_trace

FREQ_TOLERANCE = 0.10  # windows within 10 % of a pattern's frequency belong to it


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return v


def _non_negative(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be zero or a positive number: {text!r}")
    return v


def _ratio(text: str) -> float:
    v = _positive(text) if text.strip() not in ("0", "0.0") else 0.0
    if v > 1:
        raise argparse.ArgumentTypeError(f"must be a ratio between 0 and 1: {text!r}")
    return v


def _band(text: str) -> tuple[float, float]:
    try:
        lo_s, hi_s = text.split("-", 1) if "-" in text else text.split(",", 1)
        lo, hi = float(lo_s), float(hi_s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"band must read LOW-HIGH in Hz: {text!r}") from None
    if not (0 <= lo < hi):
        raise argparse.ArgumentTypeError(f"band must have 0 <= LOW < HIGH: {text!r}")
    return lo, hi


def _gpus(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return v


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE",
                        help="trace: nvidia-smi --query-gpu CSV log, or a cte recording")
    parser.add_argument("--gpus", type=_gpus, metavar="N",
                        help="GPUs per poll, for nvidia-smi logs without an index column")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="report format (default: text)")
    parser.add_argument("--tdp", type=_positive, metavar="WATTS",
                        help="power limit per GPU when the trace does not record one")
    parser.add_argument("--window", type=_positive, default=30.0, metavar="SECONDS",
                        help="step-scale window (default: 30)")
    parser.add_argument("--step", type=_positive, metavar="SECONDS",
                        help="step-scale window advance (default: window / 3)")
    parser.add_argument("--band", type=_band, default=(0.1, 3.0), metavar="LOW-HIGH",
                        help="critical band in Hz (default: 0.1-3)")
    parser.add_argument("--min-amplitude-ratio", type=_ratio, default=0.20, metavar="R",
                        help="step swing: node amplitude / node TDP (default: 0.2)")
    parser.add_argument("--min-band-energy", type=_ratio, default=0.20, metavar="R",
                        help="step swing: share of AC energy in the band (default: 0.2)")
    parser.add_argument("--min-synchrony", type=_ratio, default=0.5, metavar="R",
                        help="step swing: GPU synchrony (default: 0.5)")
    parser.add_argument("--hold", type=_gpus, default=3, metavar="N",
                        help="step swing: consecutive windows required (default: 3)")
    parser.add_argument("--cycle-window", type=_positive, default=600.0, metavar="SECONDS",
                        help="cycle-scale window (default: 600)")
    parser.add_argument("--cycle-min-ratio", type=_ratio, default=0.05, metavar="R",
                        help="cycle: amplitude of the mean cycle / node TDP (default: 0.05)")
    parser.add_argument("--ramp-ratio", type=_ratio, default=0.30, metavar="R",
                        help="ramp: change / node TDP, or / observed range (default: 0.3)")
    parser.add_argument("--max-hz", type=_positive, metavar="HZ",
                        help="highest observable frequency, if below half the sample rate "
                        "(default: 0.5 for nvidia-smi power.draw, a ~1 s average)")
    parser.add_argument("--outlier-window", type=_positive, default=60.0, metavar="SECONDS",
                        help="stragglers: window over which each GPU is compared with its "
                        "peers (default: 60)")
    parser.add_argument("--outlier-step", type=_positive, default=10.0, metavar="SECONDS",
                        help="stragglers: window advance (default: 10)")
    parser.add_argument("--persistence", type=_non_negative, default=300.0, metavar="SECONDS",
                        help="stragglers: how long a deviation must hold to be reported "
                        "(default: 300)")
    parser.add_argument("--stall-window", type=_positive, default=2.0, metavar="SECONDS",
                        help="stalls: short window for the busy-wait signature (default: 2)")
    parser.add_argument("--stall-context", type=_positive, default=120.0, metavar="SECONDS",
                        help="stalls: span over which each GPU's compute power level is "
                        "taken (default: 120)")


# --------------------------------------------------------------------------- analysis


@dataclass
class _Grid:
    t: np.ndarray  # uniform, Unix seconds
    power: np.ndarray  # (N, M) watts
    gpus: list[int]
    dt: float
    tdp: np.ndarray  # (N,) NaN where unknown


def _grid(trace: Trace, tdp_flag: float | None) -> tuple[_Grid, list[str]]:
    notes: list[str] = []
    usable = []
    for g in trace.gpus:
        s = trace.series[g]
        ok = np.isfinite(s.fields["power_watts"])
        if ok.sum() >= 2:
            usable.append(g)
        else:
            notes.append(f"GPU {g} has no power readings and is left out")
    if not usable:
        raise TraceError(f"{trace.source}: no GPU has at least two power readings")
    t0 = max(float(trace.series[g].t[0]) for g in usable)
    t1 = min(float(trace.series[g].t[-1]) for g in usable)
    dts = [np.median(np.diff(trace.series[g].t)) for g in usable if trace.series[g].t.size > 1]
    dt = float(np.median(dts))
    if not (t1 - t0 >= 4 * dt > 0):
        raise TraceError(f"{trace.source}: the GPUs' readings overlap for too short a time")
    n = int(math.floor((t1 - t0) / dt + 1e-9)) + 1
    rel = np.arange(n) * dt
    power = np.empty((len(usable), n))
    for i, g in enumerate(usable):
        s = trace.series[g]
        p = s.fields["power_watts"]
        ok = np.isfinite(p)
        power[i] = np.interp(rel, s.t[ok] - t0, p[ok])
    tdp = np.array([trace.tdp_watts.get(g, tdp_flag if tdp_flag else np.nan) for g in usable],
                   dtype=float)
    return _Grid(t0 + rel, power, usable, dt, tdp), notes


def _merge_step(windows: list[tuple[float, float, NodeSwing]], hold: int
                ) -> list[list[tuple[float, float, NodeSwing]]]:
    runs: list[list[tuple[float, float, NodeSwing]]] = []
    cur: list[tuple[float, float, NodeSwing]] = []
    for w in windows:
        ns = w[2]
        f = ns.node.frequency_hz
        if not ns.candidate or f is None:
            if len(cur) >= hold:
                runs.append(cur)
            cur = []
            continue
        if cur:
            f_ref = float(np.median([c[2].node.frequency_hz for c in cur]))
            if abs(f - f_ref) > FREQ_TOLERANCE * f_ref:
                if len(cur) >= hold:
                    runs.append(cur)
                cur = []
        cur.append(w)
    if len(cur) >= hold:
        runs.append(cur)
    return runs


def _med(values: Sequence[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.median(v)) if v else None


def _step_swings(g: _Grid, args: argparse.Namespace, max_hz: float | None, t_start: float
                 ) -> tuple[list[dict[str, Any]], int]:
    n_win = max(4, int(round(args.window / g.dt)))
    n_step = max(1, int(round((args.step or args.window / 3) / g.dt)))
    thresholds = SwingThresholds(args.min_amplitude_ratio, args.band, args.min_band_energy,
                                 args.min_synchrony)
    tdp = g.tdp if np.isfinite(g.tdp).all() else None
    windows = []
    m = g.t.size
    starts = range(0, max(1, m - n_win + 1), n_step)
    for a in starts:
        b = min(m, a + n_win)
        ns = analyse_window(g.t[a:b], g.power[:, a:b], tdp, args.band, gpus=g.gpus,
                            max_observable_hz=max_hz, thresholds=thresholds)
        windows.append((float(g.t[a]), float(g.t[b - 1]), ns))
    out = []
    node = g.power.sum(axis=0)
    for run in _merge_step(windows, args.hold):
        f = _med([w[2].node.frequency_hz for w in run])
        assert f is not None
        start, end = _swing_edges(g.t, node, run[0][0], run[-1][1], 1.0 / f)
        out.append({
            "scale": "step",
            "frequency_hz": f,
            "period_seconds": 1.0 / f,
            "node_amplitude_watts": _med([w[2].node.amplitude_watts for w in run]),
            "amplitude_ratio": _med([w[2].node.amplitude_ratio for w in run]),
            "synchrony": _med([w[2].synchrony for w in run]),
            "band_energy_ratio": _med([w[2].node.band_energy_ratio for w in run]),
            "duty_cycle": _med([w[2].node.duty_cycle for w in run]),
            "max_ramp_watts_per_second": max(w[2].node.max_ramp_watts_per_second for w in run),
            "windows": len(run),
            "start": start - t_start,
            "end": end - t_start,
        })
    return out, len(windows)


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


def _cycle_swings(g: _Grid, args: argparse.Namespace, t_start: float) -> list[dict[str, Any]]:
    span = float(g.t[-1] - g.t[0])
    win = min(args.cycle_window, span)
    n_win = int(round(win / g.dt))
    n_step = max(1, int(round(win / 4 / g.dt)))
    m = g.t.size
    starts = list(range(0, max(1, m - n_win), n_step))
    if starts[-1] + n_win < m:
        starts.append(m - n_win)
    tdp = g.tdp if np.isfinite(g.tdp).all() else None
    runs: list[list[tuple[float, float, CycleFeatures]]] = []
    cur: list[tuple[float, float, CycleFeatures]] = []
    for a in starts:
        b = min(m, a + n_win)
        c = analyse_cycles(g.t[a:b], g.power[:, a:b], tdp)
        if c is not None:
            ratio = c.amplitude_ratio
            if ratio is None:  # no TDP: compare with the window's peak node power
                peak = float(np.percentile(g.power[:, a:b].sum(axis=0), 95))
                ratio = c.amplitude_watts / peak if peak > 0 else 0.0
            if ratio < args.cycle_min_ratio:
                c = None
        if cur and (c is None or abs(c.period_seconds - cur[-1][2].period_seconds)
                    > FREQ_TOLERANCE * c.period_seconds):
            runs.append(cur)
            cur = []
        if c is not None:
            cur.append((float(g.t[a]), float(g.t[b - 1]), c))
    if cur:
        runs.append(cur)
    out = []
    for run in runs:
        period = _med([w[2].period_seconds for w in run])
        assert period is not None
        out.append({
            "scale": "cycle",
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


# canonical trace field -> scan() keyword
_STRAGGLER_FIELDS = {
    "sm_clock_hertz": "sm_clock",
    "temperature_celsius": "temperature",
    "utilization_gpu_ratio": "utilization",
    "clock_event_reasons": "clock_event_reasons",
}


def _field_grid(trace: Trace, g: _Grid, name: str) -> np.ndarray | None:
    """One canonical field of every GPU on the power grid (None: no GPU has it).

    Continuous fields are interpolated linearly; the clock-event bitmask holds
    its last reading.  Outside a GPU's readings the value is NaN.
    """
    t0 = float(g.t[0])
    rel = g.t - t0
    out = np.full((len(g.gpus), g.t.size), np.nan)
    found = False
    for i, gpu in enumerate(g.gpus):
        s = trace.series[gpu]
        x = s.fields.get(name)
        if x is None:
            continue
        ok = np.isfinite(x)
        if not ok.any():
            continue
        found = True
        ts, xs = s.t[ok] - t0, x[ok]
        if name == "clock_event_reasons":
            idx = np.searchsorted(ts, rel, side="right") - 1
            out[i] = np.where(idx >= 0, xs[np.maximum(idx, 0)], np.nan)
            out[i, rel > ts[-1] + 5 * g.dt + 5.0] = np.nan
        else:
            out[i] = np.interp(rel, ts, xs, left=np.nan, right=np.nan)
    return out if found else None


def _compute_grid(trace: Trace, g: _Grid) -> np.ndarray | None:
    """The compute share (the busiest math pipe's, from GPM) on the power grid, where the
    trace has profiling columns (`record` writes them once a profiling interval)."""
    grids = [grid for key in gpm.COMPUTE_KEYS if (grid := _field_grid(trace, g, key)) is not None]
    if not grids:
        return None
    stacked = np.stack(grids)
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(stacked).any(axis=0),
                        np.nanmax(np.where(np.isfinite(stacked), stacked, -np.inf), axis=0),
                        np.nan)


def _stragglers(trace: Trace, g: _Grid, args: argparse.Namespace, t_start: float,
                notes: list[str]) -> ScanResult:
    series = {kw: _field_grid(trace, g, f) for f, kw in _STRAGGLER_FIELDS.items()}
    missing = [f for f, kw in _STRAGGLER_FIELDS.items() if series[kw] is None]
    if missing:
        notes.append(f"not in the trace, so not compared between GPUs: {', '.join(missing)}")
    if series["utilization"] is None:
        notes.append("no utilization: stalls (busy-waiting peers) cannot be detected")
    series["compute"] = _compute_grid(trace, g)
    if series["compute"] is None:
        notes.append("no profiling (GPM) columns: the compute share is not compared")
    th = StragglerThresholds(persistence_seconds=args.persistence)
    res = scan(g.t - t_start, g.power, gpus=g.gpus, window_seconds=args.outlier_window,
               step_seconds=args.outlier_step, thresholds=th,
               stall_window_seconds=args.stall_window,
               stall_context_seconds=args.stall_context, **series)
    if not res.peer_statistics and res.reason:
        notes.append(f"no peer statistics: {res.reason}; no GPU is compared or flagged")
    return res


def analyse_trace(trace: Trace, args: argparse.Namespace) -> dict[str, Any]:
    """The report as a JSON-ready dict (what ``--format json`` prints)."""
    g, notes = _grid(trace, args.tdp)
    fs = 1.0 / g.dt
    max_hz = args.max_hz
    if max_hz is None and trace.power_averaging_seconds:
        max_hz = 0.5 / trace.power_averaging_seconds
        notes.append(
            f"{trace.power_column} is a ~{trace.power_averaging_seconds:g} s average: swings "
            f"faster than {max_hz:g} Hz are smoothed away (a 1 s average removes 1 Hz "
            "entirely and cuts 0.5 Hz to about 64 %)"
        )
    high = min(fs / 2, max_hz) if max_hz else fs / 2
    if high < args.band[1]:
        notes.append(f"the observable band ends at {high:.3g} Hz, below the critical band's "
                     f"upper edge ({args.band[1]:g} Hz): faster swings cannot be seen")
    t_start = float(g.t[0])
    step, n_windows = _step_swings(g, args, max_hz, t_start)
    cycles = _cycle_swings(g, args, t_start)
    node_tdp = float(g.tdp.sum()) if np.isfinite(g.tdp).all() else None
    if node_tdp is None:
        notes.append("power limit unknown (pass --tdp WATTS): amplitude ratios are null and "
                     "thresholds compare with the observed peak or range instead")
    ramps = detect_ramps(g.t, g.power.sum(axis=0), node_tdp, min_ratio=args.ramp_ratio)
    strag = _stragglers(trace, g, args, t_start, notes)
    if trace.skipped_lines:
        notes.append(f"{trace.skipped_lines} malformed line(s) skipped, first at line "
                     f"{trace.skipped[0][0]}: {trace.skipped[0][1]}")
    return {
        "source": trace.source,
        "format": trace.format,
        "gpus": g.gpus,
        "duration_seconds": float(g.t[-1] - g.t[0]),
        "sample_interval_seconds": g.dt,
        "observable_band_hz": [0.0, high],
        "power_column": trace.power_column,
        "tdp_watts": {str(gpu): (None if math.isnan(w) else float(w))
                      for gpu, w in zip(g.gpus, g.tdp, strict=True)},
        "node_mean_watts": float(g.power.sum(axis=0).mean()),
        "step_windows_analysed": n_windows,
        "skipped_lines": trace.skipped_lines,
        "power_swings": step + cycles,
        "ramps": [{
            "time": r.time - t_start,
            "direction": r.direction,
            "delta_watts": r.delta_watts,
            "duration_seconds": r.duration_seconds,
        } for r in ramps],
        "straggler_windows_analysed": strag.windows,
        "persistence_seconds": args.persistence,
        "peer_statistics": strag.peer_statistics,
        "outliers": [{
            "gpu": o.gpu,
            "signal": o.signal,
            "direction": o.direction,
            "score": o.score,
            "start": o.start,
            "end": o.end,
        } for o in strag.outliers],
        "stalls": [{
            "start": s.start,
            "end": s.end,
            "waiting_gpus": list(s.waiting_gpus),
            "culprit_gpus": list(s.culprit_gpus),
        } for s in strag.stalls],
        # per GPU and signal, the median |M| over the windows: how far from
        # flagging (3.5) each GPU typically was
        "peer_scores": {str(gpu): sig for gpu, sig in strag.typical_scores.items()},
        "notes": notes,
    }


# --------------------------------------------------------------------------- output


def _fmt_ratio(r: float | None) -> str:
    return "n/a" if r is None else f"{100 * r:.0f} % of TDP"


def render_text(rep: dict[str, Any]) -> str:
    lines = [
        f"trace      {rep['source']} ({rep['format']}, power from {rep['power_column']})",
        f"GPUs       {', '.join(str(g) for g in rep['gpus'])}",
        f"duration   {rep['duration_seconds']:.1f} s, one sample every "
        f"{rep['sample_interval_seconds']:.3f} s, node mean {rep['node_mean_watts']:.0f} W",
        f"observable 0-{rep['observable_band_hz'][1]:.3g} Hz",
        "",
    ]
    swings = rep["power_swings"]
    lines.append(f"power swings: {len(swings) or 'none found'}")
    for s in swings:
        extra = f", strength {s['strength']:.2f}" if "strength" in s else ""
        lines.append(
            f"  [{s['scale']}] {s['start']:.0f}-{s['end']:.0f} s: "
            f"period {s['period_seconds']:.2f} s"
            f" ({s['frequency_hz']:.3g} Hz), node amplitude {s['node_amplitude_watts']:.0f} W"
            f" ({_fmt_ratio(s['amplitude_ratio'])}), synchrony {s['synchrony']:.2f}, duty "
            f"{s['duty_cycle']:.2f}, max ramp {s['max_ramp_watts_per_second']:.0f} W/s{extra}"
        )
    lines.append(f"ramps: {len(rep['ramps']) or 'none found'}")
    for r in rep["ramps"]:
        lines.append(f"  {r['time']:.1f} s: {r['direction']} {r['delta_watts']:+.0f} W "
                     f"in {r['duration_seconds']:.2f} s")
    outl = rep["outliers"]
    lines.append(f"outliers (held >= {rep['persistence_seconds']:g} s): "
                 f"{len(outl) or 'none found'}")
    for o in outl:
        lines.append(f"  GPU {o['gpu']} {o['signal']} {o['direction']} (M {o['score']:+.1f}): "
                     f"{o['start']:.0f}-{o['end']:.0f} s")
    top = sorted(((v, int(g), sig) for g, sc in rep["peer_scores"].items()
                  for sig, v in sc.items()), reverse=True)[:3]
    if top:
        lines.append("  highest typical |M| (median over windows; flagged above 3.5): "
                     + ", ".join(f"GPU {g} {sig} {v:.1f}" for v, g, sig in top))
    stalls = rep["stalls"]
    lines.append(f"stalls: {len(stalls) or 'none found'}")
    for s in stalls:
        lines.append(f"  {s['start']:.1f}-{s['end']:.1f} s: culprit GPU(s) "
                     f"{', '.join(map(str, s['culprit_gpus']))}; waiting "
                     f"{', '.join(map(str, s['waiting_gpus']))}")
    if rep["notes"]:
        lines.append("notes:")
        lines.extend(f"  - {n}" for n in rep["notes"])
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    try:
        trace = load_trace(args.file, gpus=args.gpus)
        rep = analyse_trace(trace, args)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(rep, indent=2))
    else:
        print(render_text(rep))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cluster-telemetry-exporter analyze",
        description="Power swings, slow cycles, ramps, straggler GPUs and stalls in a GPU "
        "trace.",
    )
    add_arguments(parser)
    return parser


if __name__ == "__main__":
    sys.exit(main(build_parser().parse_args()))
