"""Holes in a series, judged against the time scale of the analysis that reads it.

A hole (a stretch without samples: a poll loop that stalled, a drain that came late, a
GPU that hung) matters only relative to what an analysis looks for: a 2 s hole hides a
2 Hz step swing inside it, but nothing of a 68 s checkpoint cycle or a 5-minute
straggler. So each analysis has a :class:`Bridge`: the longest hole it crosses (a share
of its own time scale: its window, or the period it finds) and how (``interpolate``
across it on its grid, ``hold`` its last verdict through it, or ``fold`` only the
measured samples). A window that holds a longer hole, or that is less than half
measured, is left out of that analysis alone; the others still read it.

One rule for the offline ``analyze`` (exporter.commands.analyze) and the live analyses
(exporter.sampling): both build their bridges with :func:`bridge` and ask
:meth:`Bridge.window_ok` (or :func:`fill`, on a grid with NaN in its holes). Any other
analysis over time (an accounting of where the time went, say) can do the same: name
its scale, take a share, and ask the same questions. docs/trace-format.md#gaps lists
each analysis' bridge and the reason for its limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

INTERPOLATE = "interpolate"  # a straight line from the last sample before to the first after
HOLD = "hold"  # the verdict before the hole holds through it when the one after agrees
FOLD = "fold"  # only measured samples are folded; the line across the hole feeds the rest
MAX_FILLED = 0.5  # a window at most half made up of bridged holes: most of it is measured

# The share of each analysis' time scale that a hole may span and still be bridged, and
# how; docs/trace-format.md#gaps gives the reasons.
SHARES: dict[str, tuple[float, str, str]] = {
    # name: (share, how, the scale it is a share of)
    "step": (0.1, INTERPOLATE, "the swing window (--window)"),
    "segments": (0.1, INTERPOLATE, "the segment window (--segment-window)"),
    "cycle": (0.25, FOLD, "the cycle's period (up to a quarter of --cycle-window)"),
    "ramps": (0.2, INTERPOLATE, "the 25 s of steady power a ramp needs either side"),
    "dips": (0.2, INTERPOLATE, "the 25 s of steady power either side of a dip"),
    "outliers": (0.1, INTERPOLATE, "the straggler window (--outlier-window)"),
    "stalls": (0.05, HOLD, "the stall context (--stall-context)"),
    # the goodput account holds a GPU's state through a hole up to its own limit,
    # analysis.goodput.bridge_limit (5 s or 3 sampling intervals, shorter than any
    # checkpoint pause), which the account and this report both use; past it those
    # seconds are `unknown`
    "goodput": (1.0, HOLD, "the account's hold (5 s, or 3 sampling intervals)"),
}
RAMP_HOLD_SECONDS = 25.0  # analysis.ramps: steady power either side of a ramp


@dataclass(frozen=True)
class Bridge:
    """How far one analysis bridges a hole, and how."""

    analysis: str
    scale_seconds: float  # the analysis' own time scale
    share: float  # of it, the longest hole bridged
    how: str  # INTERPOLATE, HOLD or FOLD
    max_filled: float = MAX_FILLED

    @property
    def limit_seconds(self) -> float:
        return self.share * self.scale_seconds

    def bridges(self, hole_seconds: float) -> bool:
        return hole_seconds <= self.limit_seconds

    def bridges_at(self, scale_seconds: float, hole_seconds: float) -> bool:
        """Whether the hole is bridged on a scale found in the data (a cycle's period),
        not the one the bridge was made for."""
        return hole_seconds <= self.share * scale_seconds

    def window_ok(self, holes: Sequence[tuple[float, float]], start: float, end: float
                  ) -> bool:
        """Whether the window [start, end] can be analysed: every hole that reaches into it
        (its (start, end) times) is bridged, and the holes fill at most ``max_filled``."""
        inside = [(a, b) for a, b in holes if a < end and b > start]
        if any(not self.bridges(b - a) for a, b in inside):
            return False
        filled = sum(min(b, end) - max(a, start) for a, b in inside)
        return filled <= self.max_filled * max(end - start, 0.0)

    def to_json(self) -> dict[str, object]:
        return {"bridges_up_to_seconds": self.limit_seconds, "how": self.how}


def bridge(analysis: str, scale_seconds: float) -> Bridge:
    """The bridge of one of the analyses in :data:`SHARES`, on its scale (seconds)."""
    share, how, _ = SHARES[analysis]
    return Bridge(analysis, float(scale_seconds), share, how)


def holes_of(t: np.ndarray, measured: np.ndarray) -> list[tuple[float, float]]:
    """(last measured time before, first after) of each run of unmeasured grid points.

    A run at either end of the grid is no hole (there is nothing on its far side): the
    window simply begins or ends there."""
    m = np.asarray(measured, dtype=bool)
    edges = np.diff(np.concatenate([[1], m.astype(np.int8), [1]]))
    out = []
    for lo, hi in zip(np.flatnonzero(edges == -1).tolist(), np.flatnonzero(edges == 1).tolist(),
                      strict=True):
        if lo > 0 and hi < m.size:
            out.append((float(t[lo - 1]), float(t[hi])))
    return out


def usable(t: np.ndarray, holes: Sequence[tuple[float, float]], b: Bridge) -> np.ndarray:
    """Per grid time: False strictly inside a hole the bridge does not span (no window
    of this analysis may hold it), True elsewhere."""
    ok = np.ones(t.size, dtype=bool)
    for lo, hi in holes:
        if not b.bridges(hi - lo):
            ok[(t > lo) & (t < hi)] = False
    return ok


def fill(t: np.ndarray, x: np.ndarray, b: Bridge, *, hold_edges: bool = True
         ) -> np.ndarray | None:
    """(N, M) rows on the grid ``t`` with NaN in their holes: every hole bridged by a
    straight line, or None when a row holds a hole the bridge does not span or the holes
    fill too much of the window. A row's first and last values are held to the window's
    edges with ``hold_edges`` (else NaN stays there); rows without a value stay as they
    are."""
    out = np.array(x, dtype=np.float64)
    for row in np.atleast_2d(out):
        ok = np.isfinite(row)
        if ok.all() or not ok.any():
            continue
        first, last = np.flatnonzero(ok)[[0, -1]]
        # the window's own edges (a GPU not yet sampled, or not yet drained) are no hole
        span = slice(first, last + 1)
        if not b.window_ok(holes_of(t[span], ok[span]), float(t[0]), float(t[-1])):
            return None
        if hold_edges:
            row[:] = np.interp(t, t[ok], row[ok])
        else:
            row[span] = np.interp(t[span], t[ok], row[ok])
    return out


def bridges_for(power: Any = None, stragglers: Any = None) -> dict[str, Bridge]:
    """Every analysis' bridge, by name, on the scales of the settings given (the power
    analyses' from a sampling.settings.PowerSettings, the stragglers' from a
    StragglerSettings): the one table the offline and the live analyses share."""
    scales: dict[str, float] = {}
    if power is not None:
        scales |= {"step": power.window_seconds,
                   "segments": power.segment_window_seconds,
                   # the cycle scan reports periods up to a quarter of its window
                   "cycle": power.cycle_window_seconds / 4,
                   "ramps": RAMP_HOLD_SECONDS, "dips": RAMP_HOLD_SECONDS}
    if stragglers is not None:
        scales |= {"outliers": stragglers.window_seconds,
                   "stalls": stragglers.stall_context_seconds}
    return {name: bridge(name, seconds) for name, seconds in scales.items()}
