"""analyze's one-off events: ramps (level changes and the two edges of every dip),
dips (pauses), and the link from a dip to the stall finding it overlaps."""

from __future__ import annotations

from typing import Any

from exporter.analysis.power_swing import Dip, Ramp, detect_dips, detect_ramps
from exporter.analysis.straggler_scan import Stall
from exporter.offline.request import AnalyzeRequest
from exporter.offline.swings import Grid

MIN_FILL_SECONDS = 2.0  # a pause shorter than this is a hiccup, not a dip
STALL_SLACK_SECONDS = 2.0  # a stall this close to a dip belongs to it


def fill_seconds(swings: list[dict[str, Any]]) -> float:
    """Gaps narrower than this are a swing's low phases, not pauses: the longest step period."""
    periods = [s["period_seconds"] for s in swings if s["scale"] == "step"
               and s.get("period_seconds")]
    periods += [1.0 / s["apparent_frequency_hz"] for s in swings
                if s["scale"] == "step" and s.get("apparent_frequency_hz")]
    return max([MIN_FILL_SECONDS, *periods])


def _ramp_json(r: Ramp, t_start: float, dip: int | None) -> dict[str, Any]:
    return {
        "time": r.time - t_start,
        "direction": r.direction,
        "delta_watts": r.delta_watts,
        "duration_seconds": r.duration_seconds,
        "watts_per_second": abs(r.delta_watts) / r.duration_seconds,
        "dip": dip,
    }


def events(g: Grid, req: AnalyzeRequest, swings: list[dict[str, Any]],
           stalls: list[Stall], t_start: float) -> tuple[list[dict], list[dict]]:
    """(ramps, dips) as report entries; times in seconds from the trace's start."""
    node = g.power.sum(axis=0)
    fill = fill_seconds(swings)
    dips = detect_dips(g.t, node, min_ratio=req.power.dip_min_ratio, fill_seconds=fill)
    level = detect_ramps(g.t, node, g.node_tdp, min_ratio=req.power.ramp_min_ratio)
    ramps = [_ramp_json(r, t_start, i) for i, d in enumerate(dips) for r in (d.fall, d.rise)]
    # detect_ramps places a change within half its 25 s hold (plus 5 s) of the edge
    near = max(fill, 17.5)
    for r in level:
        if not any(d.direction == r.direction and abs(d.time - r.time) <= near
                   for dip in dips for d in (dip.fall, dip.rise)):
            ramps.append(_ramp_json(r, t_start, None))
    ramps.sort(key=lambda r: r["time"])
    return ramps, [_dip_json(i, d, t_start, stalls) for i, d in enumerate(dips)]


def _dip_json(i: int, d: Dip, t_start: float, stalls: list[Stall]) -> dict[str, Any]:
    a, b = d.start - t_start, d.end - t_start
    linked = [i for i, s in enumerate(stalls)
              if s.start < b + STALL_SLACK_SECONDS and s.end > a - STALL_SLACK_SECONDS]
    return {
        "start": a,
        "end": b,
        "duration_seconds": d.duration_seconds,
        "depth_watts": d.depth_watts,
        "depth_ratio": d.depth_ratio,
        "level_before_watts": d.level_before_watts,
        "level_watts": d.level_watts,
        "level_after_watts": d.level_after_watts,
        "fall": _ramp_json(d.fall, t_start, i),
        "rise": _ramp_json(d.rise, t_start, i),
        "stalls": linked,
    }
