"""The `profiling` collector: per-GPU profiling metrics from NVML GPM (Hopper and later):
how much of the time the GPU computes, and how much it only waits.

`gpu_utilization_ratio` says a kernel was running; a GPU spinning in an NCCL collective
while it waits for a straggler counts as 100 % busy. GPM's counters (the ones
dcgm-exporter exports as `DCGM_FI_PROF_*`) tell the two apart: the tensor and FP pipes
are busy only while the GPU computes.

Each read takes one GPM sample per GPU (exporter/gpu/gpm.py) and reports the metrics
since the previous one, so the values are averages over the whole interval, without
gaps. Cost on an H200: nvmlGpmSampleGet 52 us and nvmlGpmMetricsGet 1.0-1.9 ms per GPU
and read; every 10 s (the default `--collector.profiling.interval`) that is ~12 ms per
10 s for 8 GPUs, 0.12 % of one core, against the exporter's ~1 % budget (every second it
would take all of it). Support is asked once per GPU; where GPM is unsupported,
`gpu_profiling_supported` is 0 with the reason, and the ratios are absent for that GPU.

On a GPU in MIG mode the whole-GPU sample is not taken (it needs root there); each GPU
instance is sampled instead, and the GPU's energy is split between its instances
(exporter/collectors/profiling/mig.py). Per instance that is one ~52 us sample and one
~1.5 ms metrics call per read: an estimate from the whole-GPU figures (no MIG-mode GPU
was measured), so 7 instances cost about what 7 GPUs do.

Every reading also keeps the last two minutes of each GPU's compute share (the busiest
math pipe), which the live straggler analysis takes as its `compute` signal.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.collectors.profiling.mig import MigEnergy, MigProfiler
from exporter.gpu import gpm
from exporter.sampling.collector_api import (
    CollectorContext,
    ComputeShares,
    ComputeShareSource,
    HoldsResources,
)

__all__ = ["DEFAULT_INTERVAL_SECONDS", "GpuProfile", "ProfilingReading", "ProfilingCollector"]

#: Seconds between GPM samples (see the module's docstring for the CPU it costs).
DEFAULT_INTERVAL_SECONDS = 10.0
#: How far back each GPU's compute shares in a reading go (the straggler window is 60 s).
SHARES_SECONDS = 120.0


@dataclass(frozen=True)
class GpuProfile:
    status: str  # one of gpm.REASONS
    reading: gpm.GpmReading | None  # the last interval (None: not yet, or not supported)


@dataclass(frozen=True)
class ProfilingReading(ComputeShareSource):
    time: float
    gpus: Mapping[int, GpuProfile]
    # gpu -> ((end of interval, compute share), ...), oldest first, over SHARES_SECONDS
    shares: Mapping[int, tuple[tuple[float, float], ...]]
    # (GPU, GPU instance) -> its last interval, for GPUs in MIG mode
    instances: Mapping[tuple[int, int], gpm.GpmReading] = field(
        default_factory=lambda: MappingProxyType({}))
    # GPU in MIG mode -> its energy split between its instances
    mig_energy: Mapping[int, MigEnergy] = field(default_factory=lambda: MappingProxyType({}))

    def compute_shares(self) -> ComputeShares:
        """Each GPU's recent compute shares (the sampler hands them to the analyses)."""
        return self.shares


class ProfilingCollector(HoldsResources):
    """Reads GPM on every readable GPU of the node, one sample per GPU and read."""

    name = "profiling"

    def __init__(self, context: CollectorContext,
                 on_reading: Callable[[int, gpm.GpmReading], None] | None = None):
        """`on_reading`: called with each GPU's new interval (`record` writes it)."""
        backend = context.backend
        self.readers = ([gpm.GpmReader(backend, gpu) for gpu in range(context.gpu_count)]
                        if backend is not None else [])
        self.readable = context.readable
        self.clock = context.clock
        self.on_reading = on_reading
        self._last: dict[int, gpm.GpmReading] = {}
        self._shares: dict[int, deque[tuple[float, float]]] = {}
        self.mig = MigProfiler(context)
        self._instances: dict[tuple[int, int], gpm.GpmReading] = {}

    def read(self) -> ProfilingReading:
        now = self.clock()
        gpus: dict[int, GpuProfile] = {}
        energy: dict[int, MigEnergy] = {}
        for gpu, reader in enumerate(self.readers):
            if not self.readable(gpu):
                reader.restart()  # the next interval starts once it is back
                self.mig.restart(gpu)
                self._last.pop(gpu, None)
                self._forget_instances(gpu)
                if reader.status is not None:
                    gpus[gpu] = GpuProfile(reader.status, None)
                continue
            instances = self.mig.instances(gpu)
            if instances is not None:
                self._last.pop(gpu, None)
                status, found, energy[gpu] = self.mig.read(gpu, instances, now)
                if not instances:  # MIG mode without instances yet: the GPU's own answer
                    status = reader.support()
                self._forget_instances(gpu)
                self._instances.update({(gpu, gi): r for gi, r in found.items()})
                gpus[gpu] = GpuProfile(status, None)
                continue
            self.mig.forget(gpu)
            self._forget_instances(gpu)
            reading = reader.read(now)
            if reading is not None:
                self._keep(gpu, reading)
            else:  # a first sample, a failed one or no GPM: no current values (not stale ones)
                self._last.pop(gpu, None)
            gpus[gpu] = GpuProfile(reader.support(), self._last.get(gpu))
        shares = {gpu: tuple(s) for gpu, s in self._shares.items() if s}
        return ProfilingReading(now, MappingProxyType(gpus), MappingProxyType(shares),
                                MappingProxyType(dict(self._instances)),
                                MappingProxyType(energy))

    def _forget_instances(self, gpu: int) -> None:
        for key in [k for k in self._instances if k[0] == gpu]:
            del self._instances[key]

    def _keep(self, gpu: int, reading: gpm.GpmReading) -> None:
        self._last[gpu] = reading
        shares = self._shares.setdefault(gpu, deque(maxlen=256))
        share = gpm.compute_share(reading.values)
        if share is not None:
            shares.append((reading.end, share))
        while shares and shares[0][0] < reading.end - SHARES_SECONDS:
            shares.popleft()
        if self.on_reading is not None:
            self.on_reading(gpu, reading)

    def close(self) -> None:
        """Free the GPM sample buffers (the sampler calls it once this stopped reading)."""
        for reader in self.readers:
            reader.close()
        self.mig.close()
