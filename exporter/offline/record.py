"""`record`: sample GPUs (real or fake) for a while and write a cte trace.

Power and energy go in at the full sampling rate, the sweep's values once a second,
through exporter.offline.trace.TraceWriter (format: docs/trace-format.md).
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time

from exporter.gpu.backend import NvmlBackend, NvmlUnavailable
from exporter.gpu.health import GpuHealth
from exporter.gpu.state import GpuState, PowerSample, read_identity
from exporter.offline.trace import TraceWriter
from exporter.sampling.sampler import Sampler, SamplerSettings
from exporter.sim import fake
from exporter.sim.scenarios import load_scenario

POWER_FIELDS = ("power_watts", "energy_joules")
SWEEP_FIELDS = {  # trace field -> GpuState attribute
    "power_average_watts": "power_average_watts",
    "temperature_celsius": "temperature_celsius",
    "memory_temperature_celsius": "memory_temperature_celsius",
    "utilization_gpu_ratio": "utilization_gpu_ratio",
    "utilization_memory_ratio": "utilization_memory_ratio",
    "sm_clock_hertz": "sm_clock_hertz",
    "memory_clock_hertz": "memory_clock_hertz",
    "power_limit_watts": "power_limit_watts",
    "memory_used_bytes": "memory_used_bytes",
    "clock_event_reasons": "clock_event_reasons",
}
FIELDS = (*POWER_FIELDS, *SWEEP_FIELDS)


class TraceRecorder:
    """Receives the sampler's readings (from two threads) and writes them in order."""

    def __init__(self, writer: TraceWriter):
        self.writer = writer
        self.rows = 0
        self._lock = threading.Lock()

    def power(self, samples: dict[int, PowerSample]) -> None:
        with self._lock:
            for gpu, s in samples.items():
                values = {k: v for k, v in (("power_watts", s.watts),
                                            ("energy_joules", s.joules)) if v is not None}
                if values:
                    self.writer.write(s.time, gpu, values)
                    self.rows += 1

    def sweep(self, gpu: int, state: GpuState, health: GpuHealth | None) -> None:
        values = {name: getattr(state, attr) for name, attr in SWEEP_FIELDS.items()}
        values = {k: float(v) for k, v in values.items() if v is not None}
        with self._lock:
            self.writer.write(state.time, gpu, values)
            self.rows += 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, required=True, metavar="SECONDS",
                        help="how long to record")
    parser.add_argument("--out", required=True, metavar="FILE", help="trace file to write")
    parser.add_argument("--fake", action="store_true", help="record the simulated node")
    parser.add_argument("--scenario", default="training", metavar="NAME|FILE",
                        help="fake scenario (with --fake)")
    parser.add_argument("--power.sample-rate", dest="power_sample_rate_hz", type=float,
                        default=20.0, metavar="HZ", help="1-100 (default 20)")


def main(args: argparse.Namespace) -> int:
    if not 0 < args.duration <= 7 * 86400:
        print(f"record: error: --duration {args.duration:g}: expected 0 < SECONDS <= 604800",
              file=sys.stderr)
        return 2
    if not 1 <= args.power_sample_rate_hz <= 100:
        print("record: error: --power.sample-rate: expected 1-100", file=sys.stderr)
        return 2
    lib = None
    if args.fake:
        lib = fake.FakeNvmlLibrary(load_scenario(args.scenario))
        fake.install(lib)
    settings = SamplerSettings(power_hertz=args.power_sample_rate_hz, power=None,
                               stragglers=None, xid_events=False,
                               backend="fake" if args.fake else "nvml")
    sampler = Sampler(NvmlBackend(), settings)
    try:
        try:
            gpus = sampler.backend.open()
        except NvmlUnavailable as exc:
            print(f"record: {exc}; to record the simulated node, add --fake", file=sys.stderr)
            return 1
        identities = [read_identity(sampler.backend, gpu) for gpu in range(gpus)]
        tdp = {i.index: i.default_power_limit_watts for i in identities
               if i is not None and i.default_power_limit_watts}
        sampler.backend.close()
        try:
            # the exporter records instantaneous power (power_averaging_seconds null);
            # the GPU names tell a reader the generation all the same
            names = {i.index: i.name for i in identities if i is not None and i.name}
            writer = TraceWriter(args.out, range(gpus), tdp, FIELDS, host=socket.gethostname(),
                                 started_at=time.time(), power_averaging_seconds=None,
                                 gpu_names=names)
        except OSError as exc:
            print(f"record: error: cannot write {args.out}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 2
        recorder = TraceRecorder(writer)
        sampler.recorder = recorder
        sampler.start()
        time.sleep(args.duration)
        sampler.stop()
        sampler.recorder = None
        writer.close()
        print(f"recorded {args.duration:g} s of {gpus} GPUs: {recorder.rows} rows in {args.out}")
        return 0
    finally:
        if lib is not None:
            fake.uninstall()
