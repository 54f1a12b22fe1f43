"""Plausibility of trace data: what a reader keeps, and why it drops the rest.

A trace is input from anywhere (a shell loop, a hand edit, a damaged disk, an
attacker), so every value is checked against what a GPU can report:

- a GPU index above :data:`MAX_GPU_INDEX` skips its row (one bad index must not
  make a reader allocate for a billion GPUs);
- a value that is not finite, or outside its field's physical range
  (:data:`PLAUSIBLE`), is dropped (NaN) and counted by field and reason;
- a row whose time lies far from the rest of the trace is skipped (one stray
  timestamp must not stretch the analysis grid over decades).

Counts go to ``Trace.rejected`` and ``Trace.skipped``; ``analyze`` reports them.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

MAX_GPU_INDEX = 4095  # NVML numbers GPUs from 0; no node has anywhere near 4096

# canonical field -> (lowest, highest) plausible value in base units
PLAUSIBLE: dict[str, tuple[float, float]] = {
    "power_watts": (0.0, 5000.0),
    "power_average_watts": (0.0, 5000.0),
    "power_limit_watts": (0.0, 5000.0),
    "energy_joules": (0.0, 1e15),
    "temperature_celsius": (-40.0, 200.0),
    "memory_temperature_celsius": (-40.0, 200.0),
    "utilization_gpu_ratio": (0.0, 1.0),
    "utilization_memory_ratio": (0.0, 1.0),
    "sm_clock_hertz": (0.0, 1e10),
    "memory_clock_hertz": (0.0, 1e11),
    "memory_used_bytes": (0.0, 2.0**50),
    "clock_event_reasons": (0.0, 2.0**64),
}
_UNITS = {"power_watts": "W", "power_average_watts": "W", "power_limit_watts": "W",
          "energy_joules": "J", "temperature_celsius": "degC",
          "memory_temperature_celsius": "degC", "sm_clock_hertz": "Hz",
          "memory_clock_hertz": "Hz", "memory_used_bytes": "B"}
# a row more than this far (seconds) outside the bulk of the trace's times is skipped
_TIME_SLACK_SECONDS = 86400.0


def gpu_index_problem(gpu: int) -> str | None:
    """Why a GPU index cannot be right, or None."""
    if gpu < 0:
        return f"negative GPU index {gpu}"
    if gpu > MAX_GPU_INDEX:
        return f"GPU index {gpu} out of range (0-{MAX_GPU_INDEX})"
    return None


def value_problem(name: str, value: float) -> str | None:
    """Why a parsed value of a canonical field cannot be right, or None (NaN = missing: fine)."""
    if math.isnan(value):
        return None
    if math.isinf(value):
        return f"{name} infinite"
    lo, hi = PLAUSIBLE.get(name, (-math.inf, math.inf))
    if value < lo:
        return f"{name} below {lo:g}{_unit(name)}"
    if value > hi:
        return f"{name} above {hi:g}{_unit(name)}"
    return None


def _unit(name: str) -> str:
    u = _UNITS.get(name)
    return f" {u}" if u else ""


_ANYWHERE = (-math.inf, math.inf)


def screen(names: list[str], values: list[float], rejected: Counter[str]) -> list[float]:
    """The values with implausible ones replaced by NaN; each counted in ``rejected``."""
    out = values
    isfinite = math.isfinite
    for i, (name, v) in enumerate(zip(names, values, strict=True)):
        if v != v:
            continue  # NaN: a missing value, fine
        lo, hi = PLAUSIBLE.get(name, _ANYWHERE)
        if lo <= v <= hi and isfinite(v):
            continue  # the common case, without building a reason
        why = value_problem(name, v)
        if why is not None:
            if out is values:
                out = list(values)
            out[i] = math.nan
            rejected[why] += 1
    return out


def time_bounds(times: np.ndarray, overwrite: bool = False) -> tuple[float, float] | None:
    """Row times outside these are far from the rest of the trace; None: keep all.

    The bulk is the 1st-99th percentile of the times; a row more than a day (or
    10x the bulk's span) outside it is a stray.  Traces of fewer than 100 rows
    are left alone (too few to tell a stray row from the trace).
    """
    if times.size < 100:
        return None
    # overwrite: `times` may be reordered (a long trace's times are not copied again)
    lo, hi = np.percentile(times, [1, 99], overwrite_input=overwrite)
    slack = max(_TIME_SLACK_SECONDS, 10 * float(hi - lo))
    return float(lo - slack), float(hi + slack)
