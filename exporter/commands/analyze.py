"""`cluster-telemetry-exporter analyze FILE`: offline power and straggler analysis of a trace.

Reads an nvidia-smi CSV log or a cte recording (exporter.traces.trace), then:

- slides the step window (default 30 s, every 10 s) over the node's power and
  keeps runs of at least ``--hold`` consecutive windows that meet the swing
  thresholds with the same dominant frequency (within 10 %): scale ``step``;
- slides the cycle window (default 10 min, every 150 s) to find slow periodic
  patterns (checkpoints, evaluation): scale ``cycle``;
- finds large synchronised rises and falls of the node's power (``ramps``) and
  pauses (``dips``: a fall, a low stretch, a rise; both edges are ramps);
- slides the straggler window (default 60 s, every 10 s) to compare each GPU
  with its peers (``outliers``: deviations that held for ``--persistence``) and
  a short window (default 2 s) for the stall signature (``stalls``: peers
  busy-waiting while a culprit idles or still computes); see docs/stragglers.md.

First it decides how much of the trace it can see (exporter.offline.band): is
the power a ~1 s average, and up to which frequency do the samples resolve a
swing; the report says which evidence decided and how sure it is.  Detectors
the trace is too short for say so; implausible values are counted, not used.
Gaps in the samples (exporter.offline.gaps) are named in the notes and the JSON;
each analysis judges them against its own time scale (exporter.analysis.bridging):
it bridges the short ones and leaves out only its windows across the longer ones.

Also runnable as ``python -m exporter.commands.analyze FILE``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import numpy as np

from exporter.analysis.averaging import finite_readings
from exporter.analysis.bridging import Bridge, bridge, bridges_for
from exporter.analysis.goodput import bridge_limit
from exporter.analysis.power_swing import NodeSwing, analyse_window
from exporter.analysis.straggler_scan import ScanResult, scan
from exporter.errors import fail
from exporter.gpu import gpm
from exporter.offline.band import AVERAGED, UNKNOWN, BandDecision, decide_band
from exporter.offline.events import MIN_FILL_SECONDS, events
from exporter.offline.field_grid import FieldGrid
from exporter.offline.gaps import (
    find_gaps,
    gaps_json,
    gaps_note,
    overlaps,
    valid_mask,
)
from exporter.offline.goodput import stall_causes, time_accounting
from exporter.offline.loading import STRAGGLER_FIELDS, input_notes, load
from exporter.offline.report import not_run_note, render_text
from exporter.offline.request import AnalyzeRequest, analyze_options
from exporter.offline.swings import (
    MIN_STEP_SAMPLES,
    Grid,
    cycle_swings,
    drop_beats,
    folded_swing,
    merge_step_swings,
    segment_swings,
    window_swings,
)
from exporter.options import ANALYZE, Option, positive, whole_at_least_one
from exporter.traces.checks import MAX_GPU_INDEX
from exporter.traces.load import load_trace  # noqa: F401  (analyze's reader, for callers)
from exporter.traces.reading import release_free_memory
from exporter.traces.trace import Trace, TraceError, power_gpus

MAX_GRID_CELLS = 50_000_000  # GPUs x samples: ~400 MB of float64 per array
def _averaging(text: str) -> float | None:
    """--power-averaging: None for auto, 0 for none (instantaneous), else seconds."""
    t = text.strip().lower()
    if t == "auto":
        return None
    if t in ("none", "0", "instant", "instantaneous"):
        return 0.0
    try:
        return positive(t)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected SECONDS (> 0), none or auto: {text!r}") from None


def _gpu_count(text: str) -> int:
    v = whole_at_least_one(text)
    if v > MAX_GPU_INDEX + 1:
        raise argparse.ArgumentTypeError(f"at most {MAX_GPU_INDEX + 1} GPUs: {text!r}")
    return v


def shared_options() -> dict[str, Option]:
    """The flags whose setting the live analyses share (one declaration, one default),
    by flag."""
    return analyze_options()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    shared = shared_options()
    parser.add_argument("file", metavar="FILE",
                        help="trace: nvidia-smi --query-gpu CSV log, or a cte recording (plain or "
                        "gzip-compressed)")
    parser.add_argument("--gpus", type=_gpu_count, metavar="N",
                        help="GPUs per poll, for nvidia-smi logs without an index column")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="report format (default: text)")
    parser.add_argument("--tdp", type=positive, metavar="WATTS",
                        help="power limit per GPU when the trace does not record one")
    shared["--window"].add_to(parser, ANALYZE)
    parser.add_argument("--step", type=positive, metavar="SECONDS",
                        help="step-scale window advance (default: window / 3)")
    shared["--band"].add_to(parser, ANALYZE)
    shared["--min-amplitude-ratio"].add_to(parser, ANALYZE)
    shared["--min-band-energy"].add_to(parser, ANALYZE)
    shared["--min-synchrony"].add_to(parser, ANALYZE)
    shared["--segment-window"].add_to(parser, ANALYZE)
    shared["--hold"].add_to(parser, ANALYZE)
    shared["--cycle-window"].add_to(parser, ANALYZE)
    shared["--cycle-min-ratio"].add_to(parser, ANALYZE)
    shared["--ramp-ratio"].add_to(parser, ANALYZE)
    parser.add_argument("--max-hz", type=positive, metavar="HZ",
                        help="cap the observable band at HZ (default: decided from the "
                        "evidence, see --power-averaging)")
    parser.add_argument("--power-averaging", type=_averaging, default=None,
                        metavar="SECONDS|none|auto",
                        help="how the power readings were made: averaged over SECONDS, none "
                        "(instantaneous), or auto (default): decided from the column, the GPU "
                        "name, the trace's header and the data, in that order")
    shared["--dip-ratio"].add_to(parser, ANALYZE)
    shared["--outlier-window"].add_to(parser, ANALYZE)
    shared["--outlier-step"].add_to(parser, ANALYZE)
    shared["--persistence"].add_to(parser, ANALYZE)
    shared["--stall-window"].add_to(parser, ANALYZE)
    shared["--stall-context"].add_to(parser, ANALYZE)


# --------------------------------------------------------------------------- analysis


def _grid(trace: Trace, tdp_flag: float | None, bridges: dict[str, Bridge] | None = None
          ) -> tuple[Grid, list[str]]:
    usable, notes = power_gpus(trace)
    t0 = max(float(trace.series[g].t[0]) for g in usable)
    t1 = min(float(trace.series[g].t[-1]) for g in usable)
    dts = [np.median(np.diff(trace.series[g].t)) for g in usable if trace.series[g].t.size > 1]
    dt = float(np.median(dts))
    if not (t1 - t0 >= 4 * dt > 0):
        raise TraceError(f"{trace.source}: the GPUs' readings overlap for too short a time "
                         f"({max(0.0, t1 - t0):.3g} s; at least 4 samples are needed)")
    n = int(math.floor((t1 - t0) / dt + 1e-9)) + 1
    if n * len(usable) > MAX_GRID_CELLS:
        raise TraceError(f"{trace.source}: {len(usable)} GPUs over {t1 - t0:.0f} s at one "
                         f"sample every {dt:.3g} s are {n * len(usable):,} values, more than "
                         f"the {MAX_GRID_CELLS:,} analyze handles: cut the trace")
    rel = np.arange(n) * dt
    power = np.empty((len(usable), n))
    readings = {g: finite_readings(trace.series[g].t, trace.series[g].fields["power_watts"])
                for g in usable}  # the arrays themselves where every reading is finite
    for i, g in enumerate(usable):
        ts, p = readings[g]
        power[i] = np.interp(rel, ts - t0, p)
    tdp = np.array([trace.tdp_watts.get(g, tdp_flag if tdp_flag else np.nan) for g in usable],
                   dtype=float)
    first = trace.series[usable[0]]
    raw_t = first.t[(first.t >= t0) & (first.t <= t1)]
    raw_node = np.zeros(raw_t.size)
    for g in usable:
        raw_node += np.interp(raw_t, *readings[g])
    times = {g: ts for g, (ts, _) in readings.items()}
    gaps = [gap for gap in find_gaps(times) if gap.end > t0 and gap.start < t1]
    valid = measured = None
    if gaps:
        valid = valid_mask(t0 + rel, gaps)
        measured = np.stack([valid_mask(t0 + rel, find_gaps({g: times[g]})) for g in usable])
    if bridges is None:
        default = AnalyzeRequest()
        bridges = bridges_for(default.power, default.stragglers)
    return Grid(t0 + rel, power, usable, dt, tdp, raw_t, raw_node, gaps, valid, measured,
                bridges), notes


def _field_columns(trace: Trace, g: Grid, name: str,
                   field_gaps: dict[str, list[tuple[int, float]]] | None = None,
                   gap_cache: dict[int, Any] | None = None,
                   rel: np.ndarray | None = None) -> FieldGrid | None:
    """One canonical field of every GPU on the power grid, made a block at a time as it
    is read (exporter.offline.field_grid); None: no GPU has a reading of it.

    Continuous fields are interpolated linearly; the clock-event bitmask holds
    its last reading.  Outside a GPU's readings the value is NaN, and inside a gap
    in them (exporter.offline.gaps: the sweep hung while power went on), each
    (GPU, seconds) then added to ``field_gaps[name]``. ``rel``: the grid's times from its
    start, where the caller has them (every field's grid reads the one array).
    """
    t0 = float(g.t[0])
    rel = g.t - t0 if rel is None else rel
    fg = FieldGrid([trace.series[gpu] for gpu in g.gpus], name, t0, rel, g.dt,
                   gap_cache=gap_cache)
    if not fg.has_readings:
        return None
    for gpu, found in zip(g.gpus, fg.gaps, strict=True):
        for a, b in found:
            # one inside the grid and not where the power has its gap (said already)
            if field_gaps is not None and b > 0 and a < rel[-1] \
                    and not overlaps(g.gaps, t0 + a, t0 + b):
                field_gaps.setdefault(name, []).append((gpu, b - a))
    return fg


def _field_grid(trace: Trace, g: Grid, name: str,
                field_gaps: dict[str, list[tuple[int, float]]] | None = None
                ) -> np.ndarray | None:
    """:func:`_field_columns`, the whole grid at once (None: no GPU has the field)."""
    fg = _field_columns(trace, g, name, field_gaps)
    return None if fg is None else fg.block(0, fg.shape[1])


def _field_gaps_notes(field_gaps: dict[str, list[tuple[int, float]]]) -> list[str]:
    return [f"{name}: {len(found)} gap(s) in its readings (GPU(s) "
            f"{', '.join(map(str, sorted({gpu for gpu, _ in found})))}, "
            f"{sum(s for _, s in found):.1f} s in all), read as missing there, "
            "not interpolated" for name, found in sorted(field_gaps.items())]


def _compute_grid(trace: Trace, g: Grid) -> np.ndarray | None:
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


def _stragglers(trace: Trace, g: Grid, req: AnalyzeRequest, t_start: float,
                notes: list[str]) -> tuple[ScanResult, bool]:
    """The straggler scan, and whether the trace had utilization (stalls need it)."""
    # scan's keyword arguments, by name
    field_gaps: dict[str, list[tuple[int, float]]] = {}
    gap_cache: dict[int, Any] = {}  # one GPU's times' gaps, found once for every field
    rel = g.t - float(g.t[0])
    series: dict[str, Any] = {kw: _field_columns(trace, g, f, field_gaps, gap_cache, rel)
                              for f, kw in STRAGGLER_FIELDS.items()}
    notes += _field_gaps_notes(field_gaps)
    missing = [f for f, kw in STRAGGLER_FIELDS.items() if series[kw] is None]
    if missing:
        notes.append(f"not in the trace, so not compared between GPUs: {', '.join(missing)}")
    series["compute"] = _compute_grid(trace, g)
    if series["compute"] is None:
        notes.append("no profiling (GPM) columns: the compute share is not compared")
    st = req.stragglers
    res = scan(rel if t_start == float(g.t[0]) else g.t - t_start, g.power, gpus=g.gpus,
               window_seconds=st.window_seconds,
               step_seconds=st.update_seconds, thresholds=st.thresholds(),
               stall_window_seconds=st.stall_window_seconds,
               stall_context_seconds=st.stall_context_seconds,
               valid=g.usable(g.bridges["outliers"]), measured=g.measured,
               stall_bridge=g.bridges["stalls"], **series)
    return res, series["utilization"] is not None


def _straggler_not_run(strag: ScanResult, utilization: bool) -> dict[str, str]:
    """Straggler detectors the trace's columns or GPUs cannot feed -> why."""
    out = {}
    if not strag.peer_statistics and strag.reason:
        out["outliers"] = f"no peer statistics: {strag.reason}; no GPU is compared or flagged"
    if not utilization:
        out["stalls"] = "the trace has no utilization, so busy-waiting peers cannot be seen"
    return out


def _too_short(g: Grid, req: AnalyzeRequest) -> dict[str, str]:
    """Detector -> why the trace cannot feed it (absent: it runs)."""
    span = float(g.t[-1] - g.t[0])

    def have(name: str) -> tuple[float, str]:
        # with gaps, a window must fit between those its analysis cannot bridge
        clean = g.clean_seconds(g.bridges[name])
        return clean, (f"the trace ({span:.3g} s)" if clean >= span else
                       f"the longest stretch without a gap longer than {name} bridges "
                       f"({clean:.3g} s of {span:.3g} s)")

    out = {}
    window, st = req.power.window_seconds, req.stragglers
    per_window = int(round(window / g.dt))
    clean, said = have("step")
    if clean < window:
        out["step"] = f"{said} is shorter than the {window:g} s step window (--window)"
    elif per_window < MIN_STEP_SAMPLES:
        out["step"] = (f"a {window:g} s step window holds {per_window} samples (one every "
                       f"{g.dt:.3g} s); the step detector needs at least {MIN_STEP_SAMPLES}: "
                       "sample faster or lengthen --window")
    clean, said = have("cycle")
    if clean < 40.0:
        out["cycle"] = (f"{said} is shorter than the 40 s the cycle detector needs (four "
                        "periods of its shortest, 10 s)")
    clean, said = have("ramps")
    if clean < 55.0:
        out["ramps"] = f"{said} is shorter than the 55 s a ramp needs (25 s of steady power " \
            "either side)"
    clean, said = have("outliers")
    if clean < st.window_seconds:
        out["outliers"] = (f"{said} is shorter than the {st.window_seconds:g} s straggler "
                           "window (--outlier-window)")
    elif clean < st.persistence_seconds:
        out["outliers"] = (f"outliers must hold for {st.persistence_seconds:g} s (--persistence), "
                           f"longer than {said}")
    return out


def span_ok(g: Grid, req: AnalyzeRequest) -> bool:
    """Is the trace (between the gaps the segment windows cannot bridge) long enough for
    one segment window (--segment-window)?"""
    return g.clean_seconds(g.bridges["segments"]) >= min(req.power.segment_window_seconds, 60.0)


def _band_notes(band: BandDecision, req: AnalyzeRequest, fs: float) -> list[str]:
    notes = list(band.notes)
    top = band.observable_hz
    if band.kind == AVERAGED:
        notes.append(
            f"power is a ~{band.seconds:g} s average (decided by {band.decided_by}): swings "
            f"faster than {top:.3g} Hz are smoothed away (a 1 s average removes 1 Hz entirely "
            "and cuts 0.5 Hz to about 64 %), and ramp rates are lower bounds")
    elif band.kind == UNKNOWN:
        notes.append(
            "cannot tell whether power is averaged (see power_averaging): the band assumes a "
            "1 s average; pass --power-averaging none if these are instantaneous readings")
    if band.aliasing_possible and band.kind != AVERAGED:
        notes.append(
            f"readings every {1 / fs:.3g} s show at most {fs / 2:.3g} Hz: a faster swing "
            "folds into 0-{:.3g} Hz, so a periodicity found could be its alias (sample at "
            "10 Hz or more to be sure)".format(fs / 2))
    if top < req.power.band_hz[1]:
        notes.append(f"the observable band ends at {top:.3g} Hz, below the swing band's "
                     f"upper edge ({req.power.band_hz[1]:g} Hz): faster swings cannot be resolved")
    return notes


def _window_and_plateau_swings(g: Grid, req: AnalyzeRequest, band: BandDecision,
                               t_start: float, short: dict[str, str]
                               ) -> tuple[list[dict[str, Any]], int]:
    """The window and plateau swings and the windows analysed; a swing faster than the
    samples folded into one, and what it keeps from running said in `short`."""
    step, n_windows = window_swings(g, req, band, t_start) if "step" not in short else ([], 0)
    g.raw_t = g.raw_node = None  # read by the step windows alone
    release_free_memory()
    if "step" not in short and span_ok(g, req):
        step = merge_step_swings(step, segment_swings(g, req, band, t_start))
        release_free_memory()
    folded = folded_swing(g, req, band, t_start) if "step" in short else None
    if folded is not None:
        step = [folded]
        for name in ("cycle", "ramps", "dips"):
            short.setdefault(name, "the samples are dominated by a swing faster than they "
                             "can show (see power_swings)")
    return step, n_windows


def analyse_trace(trace: Trace, asked: AnalyzeRequest | argparse.Namespace
                  ) -> dict[str, Any]:
    """The report as a JSON-ready dict (what ``--format json`` prints); `asked`: the
    request, or analyze's parsed flags."""
    req = AnalyzeRequest.of(asked)
    bridges = bridges_for(req.power, req.stragglers)
    g, notes = _grid(trace, req.tdp, bridges)
    # after each stage: glibc keeps the pages of a stage's freed arrays otherwise, and
    # the next stage's peak would come on top of them
    release_free_memory()
    band = decide_band(trace, req.power_averaging, swing_band_top_hz=req.power.band_hz[1],
                       max_hz=req.max_hz)
    release_free_memory()
    notes += _band_notes(band, req, 1.0 / max(g.dt, band.sensor_update_seconds or 0.0))
    t_start = float(g.t[0])
    short = _too_short(g, req)
    step, n_windows = _window_and_plateau_swings(g, req, band, t_start, short)
    cycles = cycle_swings(g, req, t_start) if "cycle" not in short else []
    cycles, beat_notes = drop_beats(cycles, step)
    notes += beat_notes
    if g.node_tdp is None:
        notes.append("power limit unknown (pass --tdp WATTS): amplitude ratios are null and "
                     "thresholds compare with the observed peak or range instead")
    strag, has_util = _stragglers(trace, g, req, t_start, notes)
    release_free_memory()
    for name, why in _straggler_not_run(strag, has_util).items():
        short.setdefault(name, why)
    ramps, dips = events(g, req, step, strag.stalls, t_start)
    release_free_memory()
    if g.gaps:  # an edge or pause that reaches into a gap was drawn by interpolation
        ramps, dips = _clear_of_gaps(g, ramps, dips, t_start)
    if "dips" in short:
        ramps, dips = [r for r in ramps if r["dip"] is None], []
    if "ramps" in short:
        ramps = [r for r in ramps if r["dip"] is not None]
    notes += [not_run_note(name, why) for name, why in short.items()]
    if g.gaps:
        notes.append(gaps_note(g.gaps, t_start, g.gpus, list(bridges.values())))
    notes += input_notes(trace)
    report = {
        "source": trace.source,
        "format": trace.format,
        "gpus": g.gpus,
        "gpu_names": {str(k): v for k, v in sorted(trace.gpu_names.items())},
        "duration_seconds": float(g.t[-1] - g.t[0]),
        "sample_interval_seconds": g.dt,
        "observable_band_hz": [0.0, band.observable_hz],
        "power_column": trace.power_column,
        "power_averaging": band.to_json(),
        "tdp_watts": {str(gpu): (None if math.isnan(w) else float(w))
                      for gpu, w in zip(g.gpus, g.tdp, strict=True)},
        "node_mean_watts": float(g.power.sum(axis=0).mean()),
        "step_windows_analysed": n_windows,
        "skipped_lines": trace.skipped_lines,
        "rejected_values": dict(trace.rejected),
        "collapsed_rows": trace.collapsed_rows,
        "out_of_order_rows": trace.out_of_order_rows,
        "gaps": gaps_json(g.gaps, t_start,
                          [*bridges.values(), bridge("goodput", bridge_limit(g.dt))]),
        "not_run": short,
        "power_swings": step + cycles,
        "ramps": ramps,
        "dips": dips,
        **_straggler_json(strag, req),
        "time_accounting": time_accounting(
            trace, g.gpus, t_start, float(g.t[-1] - g.t[0]), g.dt, g.tdp,
            [(s.start, s.end, (*s.waiting_gpus, *s.culprit_gpus)) for s in strag.stalls]),
        "notes": notes,
    }
    if isinstance(report["stalls"], list):
        stall_causes(report["stalls"], report["time_accounting"])
    return report


def _clear_of_gaps(g: Grid, ramps: list[dict[str, Any]], dips: list[dict[str, Any]],
                   t_start: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ramps and dips that do not reach into a gap longer than their bridges span (one
    grid step of slack), the ramps' dip numbers renumbered."""
    def clear(name: str, a: float, b: float) -> bool:
        longer = [h for h in g.gaps if not g.bridges[name].bridges(h.seconds)]
        return not overlaps(longer, t_start + a - g.dt, t_start + b + g.dt)

    def seen(a: float, b: float) -> float:  # the measured seconds of [a, b]
        return (b - a) - sum(max(0.0, min(h.end, t_start + b) - max(h.start, t_start + a))
                             for h in g.gaps)

    # a pause must be seen for as long as a dip lasts at least: lines across holes can
    # stretch a hiccup into one
    kept = [i for i, d in enumerate(dips) if clear("dips", d["start"], d["end"])
            and seen(d["start"], d["end"]) >= MIN_FILL_SECONDS]
    number = {old: new for new, old in enumerate(kept)}
    out_ramps = []
    for r in ramps:
        half = r["duration_seconds"] / 2
        if r["dip"] is not None and r["dip"] not in number:
            continue
        if not clear("ramps", r["time"] - half, r["time"] + half):
            continue
        out_ramps.append(dict(r, dip=number.get(r["dip"])) if r["dip"] is not None else r)
    out_dips = []
    for i in kept:
        d = dips[i]
        n = number[i]
        out_dips.append(dict(d, fall=dict(d["fall"], dip=n), rise=dict(d["rise"], dip=n)))
    return out_ramps, out_dips


def _straggler_json(strag: ScanResult, req: AnalyzeRequest) -> dict[str, Any]:
    return {
        "straggler_windows_analysed": strag.windows,
        "persistence_seconds": req.stragglers.persistence_seconds,
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
    }


def swing_at(trace: Trace, end: float, seconds: float = 30.0,
             req: AnalyzeRequest | None = None, *, phase_grid_seconds: float = 10.0
             ) -> NodeSwing:
    """analyze's step-window analysis of the ``seconds`` before ``end`` (Unix time).

    The same grid, band decision and thresholds as ``analyze`` uses, for one
    window: what the live monitor (sampling.live_power.PowerMonitor) computes
    at ``end`` from the same samples should agree with it.
    """
    req = req or AnalyzeRequest(trace.source)
    g, _ = _grid(trace, req.tdp, bridges_for(req.power, req.stragglers))
    band = decide_band(trace, req.power_averaging, swing_band_top_hz=req.power.band_hz[1],
                       max_hz=req.max_hz)
    keep = (g.t >= end - seconds) & (g.t <= end)
    if keep.sum() < 4:
        raise TraceError(f"{trace.source}: fewer than 4 samples in the {seconds:g} s before "
                         f"{end:.3f}")
    tdp = g.tdp if np.isfinite(g.tdp).all() else None
    return analyse_window(g.t[keep], g.power[:, keep], tdp, req.power.band_hz, gpus=g.gpus,
                          max_observable_hz=band.observable_hz,
                          phase_grid_seconds=phase_grid_seconds,
                          thresholds=req.power.swing_thresholds())


def main(args: argparse.Namespace) -> int:
    req = AnalyzeRequest.of(args)
    try:
        trace = load(req)
        rep = analyse_trace(trace, req)
    except TraceError as exc:
        return fail("analyze", str(exc))
    del trace  # the report is all that is left to print
    if req.format == "json":
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
