"""Replay a trace as if it were live hardware: a fake NVML whose GPUs follow the trace.

`run --replay FILE [--speed X]` serves metrics from a recording (our cte traces, or
nvidia-smi CSV logs), so dashboards, rules and the analysers can be shown on real data.
The trace loops: after its end it starts again, and the energy counter keeps growing.
Fields the trace lacks fall back to the simulated node's model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from exporter.offline.trace import Trace
from exporter.sim.fake import FakeNvmlLibrary, _FakeGpu
from exporter.sim.scenarios import DeviceSpec, Scenario, Workload

REPLAYED = ("temperature_celsius", "memory_temperature_celsius", "sm_clock_hertz",
            "memory_clock_hertz", "utilization_gpu_ratio", "utilization_memory_ratio",
            "memory_used_bytes", "clock_event_reasons")


def _filled(t: np.ndarray, values: np.ndarray) -> np.ndarray | None:
    """Gaps filled from the neighbours; None when the field never has a value."""
    good = np.isfinite(values)
    if not good.any():
        return None
    return np.interp(t, t[good], values[good])


class _TraceGpu(_FakeGpu):
    """One GPU's physics read from its trace series (power, energy, the sweep's fields)."""

    def __init__(self, index: int, scenario: Scenario, start: float, trace: Trace,
                 speed: float):
        super().__init__(index, scenario, start, scenario.workload.step_period_seconds,
                         scenario.workload.compute_fraction)
        series = trace.series[trace.gpus[index]]
        self.t = series.t - series.t[0]
        self.duration = max(float(self.t[-1]), 1e-3)
        self.speed = speed
        power = _filled(series.t, series.fields["power_watts"])
        self.watts = power if power is not None else np.zeros_like(self.t)
        steps = (self.watts[1:] + self.watts[:-1]) / 2 * np.diff(self.t)
        self.energy = np.concatenate([[0.0], np.cumsum(steps)])  # joules along the trace
        self.fields = {name: f for name in REPLAYED if name in series.fields
                       and (f := _filled(series.t, series.fields[name])) is not None}
        self.training = True

    def _position(self, t: float) -> tuple[int, float]:
        """(loop number, seconds into the trace) for wall-clock time t."""
        along = max(0.0, t - self.start) * self.speed
        loops = math.floor(along / self.duration)
        return loops, along - loops * self.duration

    def ideal_power(self, t: float) -> float:
        return float(np.interp(self._position(t)[1], self.t, self.watts))

    def instant_power(self, t: float, update_period: float) -> float:
        return self.ideal_power(t)

    def energy_joules(self, t: float) -> float:
        loops, pos = self._position(t)
        trace_joules = loops * self.energy[-1] + float(np.interp(pos, self.t, self.energy))
        return trace_joules / self.speed  # the same power over 1/speed of the time

    def recorded(self, name: str, t: float) -> float | None:
        values = self.fields.get(name)
        if values is None:
            return None
        return float(np.interp(self._position(t)[1], self.t, values))


def replay_library(trace: Trace, speed: float = 1.0,
                   clock: Callable[[], float] = time.time) -> FakeNvmlLibrary:
    """A fake NVML library whose GPUs replay `trace` at `speed`."""
    tdp = max(trace.tdp_watts.values(), default=700.0)
    scenario = Scenario(
        name=f"replay of {trace.source}",
        gpus=len(trace.gpus),
        device=DeviceSpec(name="replayed GPU", power_limit_watts=tdp,
                          default_power_limit_watts=tdp),
        workload=Workload(type="training"),
    )
    lib = FakeNvmlLibrary(scenario, clock)
    lib.gpus = [_TraceGpu(i, scenario, lib.start, trace, speed) for i in range(len(trace.gpus))]
    return lib
