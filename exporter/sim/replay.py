"""Replay a trace as if it were live hardware: a fake NVML whose GPUs follow the trace.

`run --replay FILE [--speed X]` serves metrics from a recording (our cte traces, or
nvidia-smi CSV logs), so dashboards, rules and the analysers can be shown on real data.
The trace loops: after its end it starts again. Its power rows become the driver's
buffer of power samples, at the trace's own timestamps. The replay serves what the trace
has and nothing else: a value the trace lacks (clocks in a log of power and temperature,
ECC, NVLink, PCIe) is NotSupported, so it is absent from /metrics, never simulated; so is
the power of a GPU with fewer than two plausible power readings (implausible readings were
dropped when the trace was read), and a trace in which no GPU has two is refused at start,
as `analyze` refuses it. GPM
metrics come from the trace's profiling columns (the value recorded at the end of the
interval asked for), and GPM is unsupported in a trace without them.

At `--speed X` the trace's samples arrive X times as fast, so the replayed driver's
buffer holds X times as many: it spans the same wall time as a real one (~2.4 s), and a
drain every `--power.drain-interval` loses nothing at any speed. A speed that would
deliver more than MAX_REPLAY_SAMPLE_RATE samples a second per GPU is refused: the
exporter's ring (sampling/buffers.py) would then hold less than the minute its swing,
ramp and straggler windows look at.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable

import numpy as np

from exporter.gpu import catalogue, gpm
from exporter.sampling.power_loop import SAMPLES_PER_SECOND_KEPT
from exporter.sim.fake import FakeNvmlLibrary
from exporter.sim.physics import FakeGpu
from exporter.sim.scenarios import DeviceSpec, Scenario, Workload
from exporter.traces.trace import Trace, TraceError, power_gpus

UNNAMED = "replayed GPU"  # a GPU whose name the trace did not record
log = logging.getLogger(__name__)


def _filled(t: np.ndarray, values: np.ndarray) -> np.ndarray | None:
    """Gaps filled from the neighbours; None when the field never has a value."""
    good = np.isfinite(values)
    if not good.any():
        return None
    return np.interp(t, t[good], values[good])


class TraceGpu(FakeGpu):
    """One GPU's physics read from its trace series: power samples and recorded values."""

    def __init__(self, index: int, scenario: Scenario, start: float, trace: Trace,
                 speed: float):
        super().__init__(index, scenario, start, scenario.workload.step_period_seconds,
                         scenario.workload.compute_fraction)
        series = trace.series[trace.gpus[index]]
        self.uuid = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{trace.source}#{index}"))
        self.speed = speed
        t0 = series.t[0]
        power = series.fields["power_watts"]
        rows = np.isfinite(power)  # the reader dropped implausible readings: NaN
        self.has_power = int(rows.sum()) >= 2  # as power_gpus() decides
        self.power_t = series.t[rows] - t0  # the trace's own sample times
        self.power_w = power[rows]
        # one pass, in trace seconds: over the power rows, or all rows of a GPU without power
        along = self.power_t if self.has_power else series.t - t0
        step = float(np.median(np.diff(along))) if len(along) > 1 else 1.0
        self.loop_seconds = float(along[-1]) + step
        if not self.has_power:  # never served (provides() says no)
            self.power_t, self.power_w = np.zeros(1), np.zeros(1)
        self.t = series.t - t0
        self.fields = {name: f for name in (*catalogue.TRACE_KEYS, *gpm.KEYS)
                       if name in series.fields
                       and (f := _filled(self.t, series.fields[name])) is not None}
        self.tdp = trace.tdp_watts.get(trace.gpus[index])
        # the name the trace recorded (cte header, nvidia-smi's name column)
        self.name = trace.gpu_names.get(trace.gpus[index]) or UNNAMED
        self.training = True

    def provides(self, key: str) -> bool:
        if key == "power_watts":
            return self.has_power
        if key == "default_power_limit_watts":
            return self.tdp is not None
        return key in self.fields

    def recorded(self, name: str, t: float) -> float | None:
        if name == "default_power_limit_watts":
            return self.tdp
        values = self.fields.get(name)
        if values is None:
            return None
        if name == "energy_joules":  # a counter keeps growing over the loops
            loops, position = self._position(t)
            return loops * float(values[-1] - values[0]) + float(
                np.interp(position, self.t, values))
        return float(np.interp(self._position(t)[1], self.t, values))

    def _position(self, t: float) -> tuple[int, float]:
        """(loop number, trace seconds into the loop) for clock time t."""
        along = max(0.0, t - self.start) * self.speed
        loops = math.floor(along / self.loop_seconds)
        return loops, along - loops * self.loop_seconds

    # -- the trace's power rows as the driver's sample buffer ------------------------------
    def sample_time(self, k: int) -> float:
        loops, i = divmod(k, len(self.power_t))
        return self.start + (loops * self.loop_seconds + self.power_t[i]) / self.speed

    def sample_watts(self, k: int) -> float:
        return float(self.power_w[k % len(self.power_w)])

    def sample_times(self, ks: np.ndarray) -> np.ndarray:
        loops, i = np.divmod(ks, len(self.power_t))
        return self.start + (loops * self.loop_seconds + self.power_t[i]) / self.speed

    def samples_watts(self, ks: np.ndarray) -> np.ndarray:
        return self.power_w[ks % len(self.power_w)]

    def samples_run(self, first: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        ks = np.arange(first, first + n)
        return self.sample_times(ks), self.samples_watts(ks)

    def _index_at(self, t: float) -> int:
        """The index of the last sample taken at or before clock time t (-1 if none)."""
        if t < self.sample_time(0):
            return -1
        loops, position = self._position(t)
        i = int(np.searchsorted(self.power_t, position, side="right")) - 1
        return loops * len(self.power_t) + i

    def samples_between(self, t0: float, t1: float) -> range:
        return range(self._index_at(t0) + 1, self._index_at(t1) + 1)

    def instant_power(self, t: float, update_period: float) -> float:
        return self.sample_watts(max(0, self._index_at(t)))

    def ideal_power(self, t: float) -> float:
        return float(np.interp(self._position(t)[1], self.power_t, self.power_w))


# Samples a second per GPU a replay may deliver: the ring keeps 660 s at 64 a second,
# so at this rate it still holds 66 s, more than the 60 s live windows need.
MAX_REPLAY_SAMPLE_RATE = SAMPLES_PER_SECOND_KEPT * 10
# Seconds of wall time the replayed driver's buffer spans (a real one: 119 samples, ~2.4 s),
# with room for bursts of closely spaced samples in the trace.
BUFFER_SECONDS = 2.4 * 1.5


def trace_sample_rate(trace: Trace) -> float:
    """The fastest GPU's power samples a second, from its median interval."""
    rates = [1.0]
    for series in trace.series.values():
        power = series.fields.get("power_watts")
        t = series.t[np.isfinite(power)] if power is not None else series.t[:0]
        if t.size > 1 and (dt := float(np.median(np.diff(t)))) > 0:
            rates.append(1.0 / dt)
    return max(rates)


def max_speed(trace: Trace) -> float:
    """The highest --speed this trace can be replayed at without losing samples."""
    return MAX_REPLAY_SAMPLE_RATE / trace_sample_rate(trace)


def replay_library(trace: Trace, speed: float = 1.0,
                   clock: Callable[[], float] = time.time, costs=None) -> FakeNvmlLibrary:
    """A fake NVML library whose GPUs replay `trace` at `speed`; TraceError when no GPU
    has two power readings, or for a speed the exporter cannot keep up with."""
    _, notes = power_gpus(trace)
    for note in notes:
        log.warning("%s: %s: its power is not served", trace.source,
                    note.removesuffix(" and is left out"))
    rate = trace_sample_rate(trace) * speed  # samples a second per GPU, on the wall clock
    if rate > MAX_REPLAY_SAMPLE_RATE * (1 + 1e-9):
        raise TraceError(
            f"{trace.source}: --speed {speed:g} would deliver {rate:.0f} power samples a "
            f"second per GPU; the exporter keeps a minute of them at up to "
            f"{MAX_REPLAY_SAMPLE_RATE} a second: use --speed "
            f"{math.floor(max_speed(trace) * 100) / 100:g} or less")
    tdp = max(trace.tdp_watts.values(), default=700.0)
    scenario = Scenario(
        name=f"replay of {trace.source}",
        gpus=len(trace.gpus),
        device=DeviceSpec(name=UNNAMED, power_limit_watts=tdp, default_power_limit_watts=tdp,
                          driver_version="", nvml_version="", nvlinks=0,
                          power_sample_buffer=max(DeviceSpec.power_sample_buffer,
                                                  math.ceil(BUFFER_SECONDS * rate))),
        workload=Workload(type="training"),
    )
    lib = FakeNvmlLibrary(scenario, clock, costs)
    lib.gpus = [TraceGpu(i, scenario, lib.start, trace, speed) for i in range(len(trace.gpus))]
    return lib
