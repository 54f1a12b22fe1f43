"""`record`: sample GPUs (real or fake) for a while and write a cte trace.

Power goes in at the sensor's native rate with the driver's own timestamps (one row per
sample), the catalogue's traced values once a sweep, the energy counter at its interval
and the GPM profiling ratios once a profiling interval (stamped with the interval's end),
through exporter.traces.trace.TraceWriter (format: docs/trace-format.md).
Progress is printed every `--progress` seconds; Ctrl-C or SIGTERM stop the recording
early and still write a complete trace and its summary. A write that fails (disk full,
file size limit) stops the recording in one line with exit code 3, the trace cut back
to its last whole row.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from exporter.collectors.profiling.reading import ProfilingCollector
from exporter.collectors.profiling.spec import SPEC as PROFILING
from exporter.config import Config, all_options
from exporter.errors import EXIT_FAILURE, fail
from exporter.gpu import catalogue, gpm
from exporter.gpu.backend import NvmlBackend, NvmlUnavailable
from exporter.gpu.reading import GpuReading
from exporter.options import RECORD, add_flags, inputs_of, resolve
from exporter.sampling.sampler import CollectorMaker, Sampler, SamplerSettings
from exporter.sim import costs, fake
from exporter.sim.scenarios import load_scenario
from exporter.traces.trace import TraceWriter
from exporter.yamlfile import ConfigError

FIELDS = ("power_watts", *catalogue.TRACE_KEYS, *gpm.KEYS)


EXIT_WRITE_FAILED = 3  # the trace could not be written on (disk full, file size limit)


class TraceRecorder:
    """Receives the sampler's readings (from several threads) and writes them in order.

    A failed write (ENOSPC, EFBIG, EIO) is kept in `failure`, every later reading is
    dropped and `stop` is set: the recording ends there, in one line, not in a traceback
    from every loop that hands it a reading."""

    def __init__(self, writer: TraceWriter, stop: threading.Event | None = None):
        self.writer = writer
        self.stop = stop
        self.failure: OSError | None = None
        self.rows = 0
        self.samples = 0
        # the span the power samples cover, by their own stamps: the driver's buffer hands
        # over the seconds before the start too, so the wall time would overstate the rate
        self.first: float | None = None
        self.last: float | None = None
        self._lock = threading.Lock()

    def _write(self, rows: list[tuple[float, int, Mapping[str, float]]]) -> bool:
        """Write rows (the caller holds the lock); False once writing has failed."""
        if self.failure is not None:
            return False
        try:
            for t, gpu, values in rows:
                self.writer.write(t, gpu, values)
        except OSError as exc:
            self.failure = exc
            if self.stop is not None:
                self.stop.set()
            return False
        self.rows += len(rows)
        return True

    def power(self, gpu: int, times: np.ndarray, watts: np.ndarray) -> None:
        with self._lock:
            if self._write([(t, gpu, {"power_watts": w})
                            for t, w in zip(times.tolist(), watts.tolist(), strict=True)]):
                self.samples += len(times)
                if len(times):
                    lo, hi = float(times.min()), float(times.max())
                    self.first = lo if self.first is None else min(self.first, lo)
                    self.last = hi if self.last is None else max(self.last, hi)

    def span(self) -> float:
        """Seconds from the first power sample to the last (0 with fewer than two)."""
        return 0.0 if self.first is None or self.last is None else self.last - self.first

    def profiling(self, gpu: int, reading: gpm.GpmReading) -> None:
        """One GPU's GPM interval: averages over (start, end], in a row at its end."""
        if not reading.values:
            return
        with self._lock:
            self._write([(reading.end, gpu, reading.values)])

    def sweep(self, gpu: int, reading: GpuReading) -> None:
        values = {k: reading.values[k] for k in catalogue.TRACE_KEYS if k in reading.values}
        if not values:
            return
        with self._lock:
            self._write([(reading.time, gpu, values)])

    def close(self) -> None:
        """Close the trace; a failure to flush its last rows counts as a failed write."""
        with self._lock:
            if self.failure is None:
                try:
                    self.writer.close()
                    return
                except OSError as exc:
                    self.failure = exc
            self.writer.abandon()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, required=True, metavar="SECONDS",
                        help="how long to record")
    parser.add_argument("--out", required=True, metavar="FILE",
                        help="trace file to write; an existing file is refused unless --force")
    parser.add_argument("--force", action="store_true",
                        help="overwrite --out if it exists (default: refuse, keep the file)")
    parser.add_argument("--progress", type=float, default=10.0, metavar="SECONDS",
                        help="print progress this often (0: never; default 10)")
    add_flags(parser, RECORD, all_options())


def sampler_settings(config: Config) -> SamplerSettings:
    """The config's sampler settings as `run` takes them, less the live analyses and XID
    events (a recording keeps samples, not conclusions)."""
    return dataclasses.replace(config.sampler, power=None, stragglers=None, xid_events=False,
                               backend=config.backend.name)


@dataclass(frozen=True)
class RecordRequest:
    """record's own inputs (its settings are the config's)."""

    duration: float  # seconds
    out: str  # the trace file
    force: bool = False  # overwrite it
    progress: float = 10.0  # seconds between progress lines (<= 0: none)


def main(args: argparse.Namespace) -> int:
    try:
        config = Config.of(**resolve(args, RECORD, all_options()))
    except ConfigError as exc:
        return fail("record", str(exc))
    req = inputs_of(RecordRequest, args)
    if not 0 < req.duration <= 7 * 86400:
        return fail("record", f"--duration {req.duration:g}: expected 0 < SECONDS <= 604800")
    if not req.force and os.path.isfile(req.out):  # before NVML starts: fail fast
        return fail("record", _exists(req.out))
    lib = None
    if config.backend.fake:
        lib = fake.FakeNvmlLibrary(load_scenario(config.backend.scenario),
                                   costs=costs.H200 if config.backend.fake_costs else None)
        fake.install(lib)
    try:
        return _record(req, config)
    finally:
        if lib is not None:
            fake.uninstall()


def _exists(path: str) -> str:
    return f"--out {path}: the file exists; pass --force to overwrite it"


def _special(path: str) -> bool:
    """Whether the path exists and is no regular file (a device, a pipe): nothing in it
    to lose, and it cannot be created anew."""
    return os.path.exists(path) and not os.path.isfile(path)


def _record(req: RecordRequest, config: Config) -> int:
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
        return fail("record", f"{exc}; to record the simulated node, add --fake", EXIT_FAILURE)
    tdp = {i.index: i.default_power_limit_watts for i in sampler.gpus.identities
           if i is not None and i.default_power_limit_watts}
    # the exporter records instantaneous power (power_averaging_seconds null); the GPU
    # names tell a reader the generation all the same
    names = {i.index: i.name for i in sampler.gpus.identities if i is not None and i.name}
    try:
        # created, never replaced, unless --force: a file that appeared since the check
        # above is refused too (a device or pipe such as /dev/stdout is written to)
        exclusive = not req.force and not _special(req.out)
        writer = TraceWriter(req.out, range(gpus), tdp, FIELDS, host=socket.gethostname(),
                             started_at=time.time(), power_averaging_seconds=None,
                             gpu_names=names, exclusive=exclusive)
    except FileExistsError:
        sampler.backend.close()
        return fail("record", _exists(req.out))
    except OSError as exc:
        sampler.backend.close()
        return fail("record", f"cannot write {req.out}: {exc.strerror or exc}")
    stop = threading.Event()
    recorder = TraceRecorder(writer, stop)
    sampler.power.recorder = recorder.power
    sampler.sweep.recorder = recorder.sweep
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    # past a file size limit (ulimit -f) a write fails with EFBIG, instead of the signal
    # killing us with the trace cut mid-row
    previous[signal.SIGXFSZ] = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    t0 = time.monotonic()
    try:
        sampler.start()
        _wait(stop, t0, req, recorder, gpus)
    finally:
        sampler.stop(close=False)
        sampler.drain_power()  # the samples since the last drain: nothing lost at the end
        sampler.backend.close()
        recorder.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    elapsed = time.monotonic() - t0
    if recorder.failure is not None:
        failure = recorder.failure
        return fail("record", f"cannot write {req.out}: {failure.strerror or failure}; "
                    f"stopped after "
                    f"{elapsed:.0f} s, the trace is readable to its last whole row (exit code "
                    f"{EXIT_WRITE_FAILED})", EXIT_WRITE_FAILED)
    early = " (stopped early)" if stop.is_set() else ""
    print(f"recorded {elapsed:.0f} s of {gpus} GPUs{early}: {recorder.samples} power samples "
          f"{_rate(recorder, gpus)}, {recorder.rows} rows in {req.out}", flush=True)
    return 0


def _rate(recorder: TraceRecorder, gpus: int) -> str:
    """The samples' span and rate per GPU, over the span the trace's samples cover."""
    span = recorder.span()
    if span <= 0 or gpus < 1:
        return "(too few to give a rate)"
    # a sample at each end of the span: n samples cover n - 1 intervals per GPU
    per_gpu = max(0.0, recorder.samples / gpus - 1) / span
    return f"over {span:.1f} s ({per_gpu:.0f}/s per GPU)"


def _wait(stop: threading.Event, t0: float, req: RecordRequest,
          recorder: TraceRecorder, gpus: int) -> None:
    """Until the duration is over or a signal says stop, with progress lines."""
    every = req.progress if req.progress > 0 else req.duration
    while not stop.wait(max(0.0, min(every, t0 + req.duration - time.monotonic()))):
        elapsed = time.monotonic() - t0
        if elapsed >= req.duration:
            return
        print(f"record: {elapsed:.0f}/{req.duration:g} s, {recorder.samples} power samples "
              f"from {gpus} GPUs", flush=True)
