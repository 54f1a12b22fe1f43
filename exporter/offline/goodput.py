"""analyze's `time_accounting`: the goodput account of a trace (exporter.analysis.goodput),
the whole trace taken as one job holding every GPU (docs/goodput.md)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from exporter.analysis.checkpoints import describe_checkpoints
from exporter.analysis.goodput import STATES, GoodputThresholds, bridge_limit, goodput_ratio
from exporter.analysis.goodput_trace import account, per_second, sparse_seconds
from exporter.traces.trace import Trace

LOST_PROGRESS_NOTE = (
    "an estimate: the productive time since the last checkpoint pause before each failure, "
    "on every GPU of the job; power cannot see what a job really rolls back to. Reported "
    "apart, never subtracted from productive")


def time_accounting(trace: Trace, gpus: Sequence[int], start: float, duration: float,
                    sample_interval: float, tdp: np.ndarray,
                    stalls: Sequence[tuple[float, float, Sequence[int]]]) -> dict[str, Any]:
    """The account of ``gpus`` over [start, start + duration] (Unix seconds), one-second
    bins; ``stalls``: (start, end) from ``start`` and the GPUs the stall check named."""
    # the seconds are laid so that the readings fall mid-second: a reading stands for the
    # time nearest it, so a pause's edges between two readings are not moved half a
    # second later on average (sparse readings, one a second, would else sit at the
    # seconds' edges)
    lead = _lead(trace, gpus, start)
    origin = start - lead  # the first second starts here, up to 1 s before the trace
    bins = max(1, math.ceil(duration + lead - 1e-9))
    weights = np.ones(bins)
    weights[0] = 1.0 - lead
    weights[-1] = max(0.0, duration + lead - (bins - 1)) if bins > 1 else max(0.0, duration)
    power = np.full((len(gpus), bins), np.nan)
    util = np.full((len(gpus), bins), np.nan)
    for i, gpu in enumerate(gpus):
        s = trace.series[gpu]
        power[i] = per_second(s.t, s.fields["power_watts"], origin, bins)[0]
        if "utilization_gpu_ratio" in s.fields:
            util[i] = per_second(s.t, s.fields["utilization_gpu_ratio"], origin, bins)[0]
    stalled = np.zeros((len(gpus), bins), dtype=bool)
    row = {gpu: i for i, gpu in enumerate(gpus)}
    for a, b, named in stalls:
        rows = [row[g] for g in named if g in row]
        stalled[np.ix_(rows, range(max(0, math.floor(a + lead)),
                                   min(bins, math.ceil(b + lead))))] = True
    # the trace's gap rule (analysis/bridging.py, "goodput"): holes up to the bridge hold
    # the readings before them, longer ones are unknown
    th = GoodputThresholds(bridge_seconds=bridge_limit(sample_interval))
    ledger = account(power, weights=weights,
                     utilization=util if np.isfinite(util).any() else None,
                     tdp=tdp if np.isfinite(tdp).any() else None, stalled=stalled,
                     sparse=sparse_seconds(sample_interval), thresholds=th)
    n = len(gpus)
    seconds = ledger.seconds.sum(axis=0) / n
    return {
        "seconds": {state: float(v) for state, v in zip(STATES, seconds, strict=True)},
        "goodput_ratio": goodput_ratio(ledger.seconds),
        "gpu_seconds": {state: float(v) for state, v in
                        zip(STATES, ledger.seconds.sum(axis=0), strict=True)},
        "energy_joules": {state: float(v) for state, v in
                          zip(STATES, ledger.joules.sum(axis=0), strict=True)},
        "per_gpu": {str(gpu): {state: float(v) for state, v in
                               zip(STATES, ledger.seconds[i], strict=True)}
                    for i, gpu in enumerate(gpus)},
        "lost_progress_estimate": {
            "failures": ledger.lost.failures,
            "gpu_seconds": ledger.lost.gpu_seconds,
            "note": LOST_PROGRESS_NOTE,
        },
        "bridged_seconds": th.bridge_seconds,
        "job": "the whole trace as one job holding every GPU",
        # each pause of the job and its cause; the writer by GPU index, as in the trace
        "pauses": [{
            "start": p.start, "end": p.start + p.seconds, "look": p.look, "cause": p.cause,
            "writer": None if p.writer is None else gpus[p.writer],
        } for p in ledger.pauses],
        "checkpoints": describe_checkpoints(
            [dataclasses.replace(p, writer=None if p.writer is None else gpus[p.writer])
             for p in ledger.pauses]),
    }


PHASE_KEPT = 0.5  # readings keep a phase within a second when their mean vector is this long


PHASE_READINGS = 4096  # per GPU, the readings the phase is taken from (evenly spread)


def _lead(trace: Trace, gpus: Sequence[int], start: float) -> float:
    """How far before ``start`` a second centred on the readings begins, in [0, 1): half a
    second before their phase within a second (its circular mean over every GPU; 0 where
    they keep none)."""
    s = c = count = 0.0
    for g in gpus:
        t = trace.series[g].t if g in trace.series else np.zeros(0)
        t = t[:: max(1, t.size // PHASE_READINGS)]
        a = 2 * np.pi * (t[np.isfinite(t)] - start)
        s, c, count = s + float(np.sin(a).sum()), c + float(np.cos(a).sum()), count + a.size
    if not count or math.hypot(s, c) < PHASE_KEPT * count:
        return 0.0  # readings at every phase (more than one a second): no phase to keep
    return float((0.5 - math.atan2(s, c) / (2 * np.pi)) % 1.0)


def stall_causes(stalls: list[dict[str, Any]], acc: dict[str, Any]) -> None:
    """Each stall the scan found gets its ``cause``: ``checkpoint`` where it lies mostly in
    a pause the account judged a checkpoint (its culprit then the GPU that wrote), else
    ``stall``."""
    ckpt = [p for p in acc["pauses"] if p["cause"] == "checkpoint"]
    for s in stalls:
        span = max(s["end"] - s["start"], 1e-9)
        inside = sum(max(0.0, min(s["end"], p["end"]) - max(s["start"], p["start"]))
                     for p in ckpt)
        s["cause"] = "checkpoint" if inside >= 0.5 * span else "stall"


def accounting_text(acc: dict[str, Any]) -> list[str]:
    """The text report's lines for a `time_accounting`."""
    ratio = acc["goodput_ratio"]
    lines = [f"goodput ratio (productive / held): "
             f"{'n/a' if ratio is None else f'{100 * ratio:.1f} %'} ({acc['job']})"]
    total = sum(acc["seconds"].values())
    for state, s in acc["seconds"].items():
        if s > 0:
            share = 100 * s / total if total else 0.0
            joules = acc["energy_joules"][state]
            lines.append(f"  {state:<12} {s:10.1f} s  {share:5.1f} %  {joules / 3.6e6:8.3f} kWh")
    if acc.get("checkpoints"):
        lines.append(f"  checkpoints: {acc['checkpoints']}")
    lost = acc["lost_progress_estimate"]
    if lost["failures"]:
        lines.append(f"  progress lost to {lost['failures']} failure(s), estimated: "
                     f"{lost['gpu_seconds']:.0f} GPU-seconds ({lost['note']})")
    return lines
