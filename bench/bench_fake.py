"""The fake NVML's own Python per call, against what the H200 model charges for it.

Where the fake's Python costs more than the modelled call, a benchmark of the exporter on
the fake overstates the exporter's CPU. Prints, on the 'training' scenario with costs off:
- per getter: median us inside the fake's symbol (called with the arguments pynvml
  passes), us of the whole pynvml call, and the ratio of the fake's us to the H200's;
- the exporter's own sweep (manual clock, 60 ticks of 1 s from t=70 s): the fake's CPU
  per second and per GPU, against the model's CPU for the same calls.
The clock moves 0.137 s between single calls and GPUs rotate, and 1 us at every read in
the sweep, so no answer is reused just because time stood still.

    PYTHONPATH=. python bench/bench_fake.py
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field

import numpy as np
import pynvml

from exporter.gpu import catalogue
from exporter.gpu.backend import NvmlBackend
from exporter.gpu.catalogue import Field
from exporter.sampling.clock import ManualClock
from exporter.sampling.sampler import Sampler, SamplerSettings
from exporter.sim import costs, fake
from exporter.sim.scenarios import load_scenario

SWEEP_FIELDS = [e.nvml.id for e in catalogue.of_cadence(catalogue.SWEEP)
                if isinstance(e.nvml, Field)]


def _fields(ids):
    values = (pynvml.c_nvmlFieldValue_t * len(ids))()
    for i, fid in enumerate(ids):
        values[i].fieldId = fid
    return ctypes.c_int32(len(ids)), ctypes.byref(values)


U = ctypes.c_uint
# (label, C symbol, the arguments after the handle as pynvml builds them, pynvml call)
GETTERS = [
    ("Temperature", "nvmlDeviceGetTemperature", lambda: (U(0), ctypes.byref(U())),
     lambda h: pynvml.nvmlDeviceGetTemperature(h, 0)),
    ("ClockInfo(SM)", "nvmlDeviceGetClockInfo", lambda: (U(1), ctypes.byref(U())),
     lambda h: pynvml.nvmlDeviceGetClockInfo(h, 1)),
    ("UtilizationRates", "nvmlDeviceGetUtilizationRates",
     lambda: (ctypes.byref(pynvml.c_nvmlUtilization_t()),),
     pynvml.nvmlDeviceGetUtilizationRates),
    ("MemoryInfo", "nvmlDeviceGetMemoryInfo", lambda: (ctypes.byref(pynvml.c_nvmlMemory_t()),),
     pynvml.nvmlDeviceGetMemoryInfo),
    ("ClocksEventReasons", "nvmlDeviceGetCurrentClocksEventReasons",
     lambda: (ctypes.byref(ctypes.c_ulonglong()),),
     pynvml.nvmlDeviceGetCurrentClocksEventReasons),
    ("EncoderUtilization", "nvmlDeviceGetEncoderUtilization",
     lambda: (ctypes.byref(U()), ctypes.byref(U())), pynvml.nvmlDeviceGetEncoderUtilization),
    (f"FieldValues({len(SWEEP_FIELDS)})", "nvmlDeviceGetFieldValues",
     lambda: _fields(SWEEP_FIELDS), lambda h: pynvml.nvmlDeviceGetFieldValues(h, SWEEP_FIELDS)),
]


def _per_call(clock: ManualClock, handles: list, call, args=tuple, n: int = 2000) -> float:
    """Median seconds of call(handle, *args()), the arguments made outside the timing
    (the median: this machine may be shared)."""
    spent = []
    for i in range(n):
        clock.advance(0.137)
        handle, more = handles[i % len(handles)], args()
        t0 = time.perf_counter()
        call(handle, *more)
        spent.append(time.perf_counter() - t0)
    return float(np.median(spent))


def per_call_table() -> None:
    clock = ManualClock()
    with fake.installed(load_scenario("training"), clock, costs=None) as lib:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(len(lib.gpus))]
        clock.advance(30)
        print(f"{'getter':<22}{'in fake us':>11}{'pynvml us':>11}{'H200 us':>9}"
              f"{'fake/H200':>11}")
        for label, symbol, args, wrapper in GETTERS:
            inside = _per_call(clock, handles, getattr(lib, symbol), args)
            whole = _per_call(clock, handles, wrapper)
            model = (costs.H200.of_fields(SWEEP_FIELDS) if symbol.endswith("FieldValues")
                     else costs.H200.of_call(symbol)).cpu
            print(f"{label:<22}{inside * 1e6:>11.1f}{whole * 1e6:>11.1f}{model * 1e6:>9.1f}"
                  f"{inside / model:>11.2f}")
        pynvml.nvmlShutdown()


@dataclass(frozen=True)
class Tally(costs.CostModel):
    """The H200's costs, added up instead of charged (charges nothing)."""

    cpu: list = field(default_factory=lambda: [0.0])

    def _add(self, cost: costs.Cost) -> costs.Cost:
        self.cpu[0] += cost.cpu
        return costs.Cost(0.0, 0.0)

    def of_call(self, symbol):
        return self._add(costs.H200.of_call(symbol))

    def of_fields(self, field_ids):
        return self._add(costs.H200.of_fields(field_ids))

    def of_samples(self, count):
        return self._add(costs.H200.of_samples(count))


class CreepingClock:
    """The fake's time: the sampler's manual clock, but 1 us later at every read, as a
    wall clock moves between calls (an answer is not reused because time stood still)."""

    def __init__(self, clock: ManualClock):
        self.clock, self.last = clock, clock.now

    def __call__(self) -> float:
        self.last = max(self.clock.now, self.last + 1e-6)
        return self.last


def _sweep(model, ticks: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Per tick: seconds in the fake (or charged by the model) and the sweep loop's CPU;
    and the calls made and the GPU count."""
    clock = ManualClock()
    with fake.installed(load_scenario("training"), CreepingClock(clock), costs=model) as lib:
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake"), clock=clock)
        sampler.start(threads=False)
        try:
            sampler.advance(70)
            loop = sampler.loop("sweep")
            calls0, inside, whole = sum(lib.calls.values()), [], []
            def spent() -> float:  # CPU inside the fake (costs off) or charged (model)
                return lib.busy_seconds if model is None else model.cpu[0]

            for _ in range(ticks):
                clock.advance(loop.period)
                busy0, cpu0 = spent(), time.thread_time()
                loop.tick()
                whole.append(time.thread_time() - cpu0)
                inside.append(spent() - busy0)
            calls = sum(lib.calls.values()) - calls0
        finally:
            sampler.stop()
        return np.array(inside), np.array(whole), calls, len(lib.gpus)


def sweep_table(ticks: int = 60) -> None:
    fake_s, loop_s, calls, gpus = _sweep(None, ticks)
    model_s = _sweep(Tally(), ticks)[0]
    ours_s = loop_s - fake_s  # the exporter's own Python in the same ticks
    plain = np.argsort(fake_s)[ticks // 2]  # the median tick: a plain sweep
    print(f"\nsweep: {ticks} ticks of 1 s, {gpus} GPUs, {calls / ticks:.0f} calls/s; ms in the "
          "fake, charged by the H200 model, and the exporter's own in the same ticks")
    print(f"{'':<22}{'fake':>8}{'H200':>8}{'exporter':>10}{'fake/H200':>11}{'fake/exporter':>15}")
    for label, f, m, o in (
            ("plain sweep (median)", fake_s[plain], model_s[plain], ours_s[plain]),
            ("per GPU, plain", fake_s[plain] / gpus, model_s[plain] / gpus, ours_s[plain] / gpus),
            ("per s, all cadences", fake_s.mean(), model_s.mean(), ours_s.mean())):
        print(f"{label:<22}{f * 1e3:>8.3f}{m * 1e3:>8.3f}{o * 1e3:>10.3f}"
              f"{f / m:>11.2f}{f / o:>15.2f}")


if __name__ == "__main__":
    per_call_table()
    sweep_table()
