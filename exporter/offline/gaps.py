"""Gaps in a trace: stretches where a GPU's power samples stopped (lines lost or cut, a
drain that came after the driver's buffer had wrapped, a logging loop that stalled on a
busy host).

Found from the trace's own timestamps: a gap is an interval between two consecutive
power samples of one GPU longer than :data:`GAP_FACTOR` times that GPU's typical
(median) interval.  Why 6: a sensor's own jitter stays below it (the H200 driver's
buffer: samples 7-46 ms apart around a median of 20 ms, at most 2.3x; a real 8x H100
nvidia-smi poll loop over 22.5 minutes: at most 1.57 s around a median of 0.297 s,
5.3x, and 3x at the 99.9th percentile), while a lost stretch is as long as whatever
was lost.  docs/trace-format.md says the same to users.

The GPUs' gaps are joined where they overlap (in a `record`, rows come in per-GPU
batches, so cut lines leave each GPU a gap at a slightly different place).  Finding a
gap drops nothing by itself: each analysis judges it against its own time scale
(exporter.analysis.bridging) and bridges it or leaves out the windows across it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from exporter.analysis.bridging import Bridge

GAP_FACTOR = 6.0  # x the typical interval between one GPU's samples
MIN_SAMPLES = 8  # fewer intervals give no typical one to compare with


@dataclass(frozen=True)
class Gap:
    start: float  # Unix seconds: the last sample before it (the first GPU to stop)
    end: float  # the first sample after it (the last GPU to resume)
    gpus: tuple[int, ...]  # the GPUs without samples in (some of) it

    @property
    def seconds(self) -> float:
        return self.end - self.start


def gpu_gaps(t: np.ndarray, factor: float = GAP_FACTOR) -> list[tuple[float, float]]:
    """(last sample before, first sample after) of each gap in one GPU's sorted times."""
    if t.size < MIN_SAMPLES:
        return []
    d = np.diff(t)
    typical = float(np.median(d))
    if not typical > 0:
        return []
    return [(float(t[i]), float(t[i + 1])) for i in np.flatnonzero(d > factor * typical)]


def find_gaps(times: Mapping[int, np.ndarray], factor: float = GAP_FACTOR) -> list[Gap]:
    """The node's gaps: every GPU's (times of its power samples, by GPU), overlapping
    ones joined, in time order."""
    spans = sorted((a, b, gpu) for gpu, t in times.items() for a, b in gpu_gaps(t, factor))
    out: list[Gap] = []
    for a, b, gpu in spans:
        if out and a < out[-1].end:
            last = out[-1]
            out[-1] = Gap(last.start, max(last.end, b), tuple(sorted({*last.gpus, gpu})))
        else:
            out.append(Gap(a, b, (gpu,)))
    return out


def valid_mask(t: np.ndarray, gaps: list[Gap]) -> np.ndarray:
    """True where a grid time is measured, False strictly inside a gap."""
    ok = np.ones(t.size, dtype=bool)
    for g in gaps:
        ok[(t > g.start) & (t < g.end)] = False
    return ok


def overlaps(gaps: list[Gap], start: float, end: float) -> bool:
    """Whether [start, end] (Unix seconds) reaches into a gap."""
    return any(start < g.end and end > g.start for g in gaps)


def _gpu_list(gpus: tuple[int, ...], every: list[int]) -> str:
    if list(gpus) == every:
        return "all GPUs"
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ", ".join(map(str, gpus))


def _counts(gaps: list[Gap], b: Bridge) -> tuple[int, int]:
    """(gaps the bridge spans, gaps it does not)."""
    n = sum(1 for g in gaps if b.bridges(g.seconds))
    return n, len(gaps) - n


def gaps_note(gaps: list[Gap], t_start: float, every: list[int], bridges: list[Bridge],
              shown: int = 5) -> str:
    """The notes' sentence for the gaps found (times from the trace's start) and what each
    analysis made of them."""
    listed = "; ".join(f"{g.start - t_start:.1f}-{g.end - t_start:.1f} s ({g.seconds:.1f} s, "
                       f"{_gpu_list(g.gpus, every)})" for g in gaps[:shown])
    more = f"; and {len(gaps) - shown} more" if len(gaps) > shown else ""
    total = sum(g.seconds for g in gaps)
    bridged, left = [], []
    for b in bridges:
        n, out = _counts(gaps, b)
        if n:
            bridged.append(f"{b.analysis} {n} (up to {b.limit_seconds:.3g} s, {b.how})")
        if out:
            left.append(f"{b.analysis} ({out})")
    said = f"bridged: {', '.join(bridged)}" if bridged else "bridged by no analysis"
    if left:
        said += f"; windows across the longer ones left out of {', '.join(left)}"
    return (f"{len(gaps)} gap(s) in the power samples (longer than {GAP_FACTOR:g}x a GPU's "
            f"typical interval), {total:.1f} s in all: {listed}{more}; each analysis judges "
            f"them against its own time scale: {said}")


def gaps_json(gaps: list[Gap], t_start: float, bridges: list[Bridge]) -> dict[str, object]:
    analyses = {}
    for b in bridges:
        n, out = _counts(gaps, b)
        analyses[b.analysis] = {**b.to_json(), "bridged": n, "left_out": out}
    return {
        "count": len(gaps),
        "total_seconds": sum(g.seconds for g in gaps),
        "holes": [{"start": g.start - t_start, "end": g.end - t_start,
                   "duration_seconds": g.seconds, "gpus": list(g.gpus)} for g in gaps],
        "analyses": analyses,
    }
