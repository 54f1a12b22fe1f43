"""`record`: sample GPUs (real or fake) for a while and write a cte trace.

Power goes in at the sensor's native rate with the driver's own timestamps (one row per
sample), the catalogue's traced values once a sweep, the energy counter at its interval
and the GPM profiling ratios once a profiling interval (stamped with the interval's end),
through exporter.traces.trace.TraceWriter (format: docs/trace-format.md).
Progress is printed every `--progress` seconds; Ctrl-C or SIGTERM stop the recording
early and still write a complete trace and its summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import socket
import sys
import threading
import time

import numpy as np

from exporter.collectors.profiling.reading import ProfilingCollector
from exporter.collectors.profiling.spec import SPEC as PROFILING
from exporter.config import Config, all_options
from exporter.gpu import catalogue, gpm
from exporter.gpu.backend import NvmlBackend, NvmlUnavailable
from exporter.gpu.state import GpuState
from exporter.options import RECORD, add_flags, resolve
from exporter.sampling.sampler import CollectorMaker, Sampler, SamplerSettings
from exporter.sim import costs, fake
from exporter.sim.scenarios import load_scenario
from exporter.traces.trace import TraceWriter
from exporter.yamlfile import ConfigError

FIELDS = ("power_watts", *catalogue.TRACE_KEYS, *gpm.KEYS)


class TraceRecorder:
    """Receives the sampler's readings (from two threads) and writes them in order."""

    def __init__(self, writer: TraceWriter):
        self.writer = writer
        self.rows = 0
        self.samples = 0
        self._lock = threading.Lock()

    def power(self, gpu: int, times: np.ndarray, watts: np.ndarray) -> None:
        with self._lock:
            for t, w in zip(times.tolist(), watts.tolist(), strict=True):
                self.writer.write(t, gpu, {"power_watts": w})
            self.rows += len(times)
            self.samples += len(times)

    def profiling(self, gpu: int, reading: gpm.GpmReading) -> None:
        """One GPU's GPM interval: averages over (start, end], in a row at its end."""
        if not reading.values:
            return
        with self._lock:
            self.writer.write(reading.end, gpu, reading.values)
            self.rows += 1

    def sweep(self, gpu: int, state: GpuState) -> None:
        values = {k: state.values[k] for k in catalogue.TRACE_KEYS if k in state.values}
        if not values:
            return
        with self._lock:
            self.writer.write(state.time, gpu, values)
            self.rows += 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, required=True, metavar="SECONDS",
                        help="how long to record")
    parser.add_argument("--out", required=True, metavar="FILE", help="trace file to write")
    parser.add_argument("--progress", type=float, default=10.0, metavar="SECONDS",
                        help="print progress this often (0: never; default 10)")
    add_flags(parser, RECORD, all_options())


def sampler_settings(config: Config) -> SamplerSettings:
    """The config's sampler settings as `run` takes them, less the live analyses and XID
    events (a recording keeps samples, not conclusions)."""
    return dataclasses.replace(config.sampler, power=None, stragglers=None, xid_events=False,
                               backend=config.backend.name)


def main(args: argparse.Namespace) -> int:
    try:
        config = Config.of(**resolve(args, RECORD, all_options()))
    except ConfigError as exc:
        print(f"record: error: {exc}", file=sys.stderr)
        return 2
    if not 0 < args.duration <= 7 * 86400:
        print(f"record: error: --duration {args.duration:g}: expected 0 < SECONDS <= 604800",
              file=sys.stderr)
        return 2
    lib = None
    if config.backend.fake:
        lib = fake.FakeNvmlLibrary(load_scenario(config.backend.scenario),
                                   costs=costs.H200 if config.backend.fake_costs else None)
        fake.install(lib)
    try:
        return _record(args, config)
    finally:
        if lib is not None:
            fake.uninstall()


def _record(args: argparse.Namespace, config: Config) -> int:
    recorder: TraceRecorder | None = None  # built once the GPUs are known

    def profiling(gpu: int, reading: gpm.GpmReading) -> None:
        if recorder is not None:
            recorder.profiling(gpu, reading)

    interval = PROFILING.settings_in(config.collectors).interval_seconds
    maker = CollectorMaker("profiling", interval,
                           lambda context: ProfilingCollector(context, on_reading=profiling))
    sampler = Sampler(NvmlBackend(), sampler_settings(config), [maker])
    try:
        gpus = sampler.open()
    except NvmlUnavailable as exc:
        print(f"record: {exc}; to record the simulated node, add --fake", file=sys.stderr)
        return 1
    tdp = {i.index: i.default_power_limit_watts for i in sampler.gpus.identities
           if i is not None and i.default_power_limit_watts}
    # the exporter records instantaneous power (power_averaging_seconds null); the GPU
    # names tell a reader the generation all the same
    names = {i.index: i.name for i in sampler.gpus.identities if i is not None and i.name}
    try:
        writer = TraceWriter(args.out, range(gpus), tdp, FIELDS, host=socket.gethostname(),
                             started_at=time.time(), power_averaging_seconds=None,
                             gpu_names=names)
    except OSError as exc:
        sampler.backend.close()
        print(f"record: error: cannot write {args.out}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    recorder = TraceRecorder(writer)
    sampler.power.recorder = recorder.power
    sampler.sweep.recorder = recorder.sweep
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    t0 = time.monotonic()
    try:
        sampler.start()
        _wait(stop, t0, args, recorder, gpus)
    finally:
        sampler.stop(close=False)
        sampler.drain_power()  # the samples since the last drain: nothing lost at the end
        sampler.backend.close()
        writer.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    elapsed = time.monotonic() - t0
    early = " (stopped early)" if stop.is_set() else ""
    print(f"recorded {elapsed:.0f} s of {gpus} GPUs{early}: {recorder.samples} power samples "
          f"({recorder.samples / max(elapsed, 1e-9) / max(gpus, 1):.0f}/s per GPU), "
          f"{recorder.rows} rows in {args.out}", flush=True)
    return 0


def _wait(stop: threading.Event, t0: float, args: argparse.Namespace,
          recorder: TraceRecorder, gpus: int) -> None:
    """Until the duration is over or a signal says stop, with progress lines."""
    every = args.progress if args.progress > 0 else args.duration
    while not stop.wait(max(0.0, min(every, t0 + args.duration - time.monotonic()))):
        elapsed = time.monotonic() - t0
        if elapsed >= args.duration:
            return
        print(f"record: {elapsed:.0f}/{args.duration:g} s, {recorder.samples} power samples "
              f"from {gpus} GPUs", flush=True)
