"""Per MIG GPU instance: GPM activity, and the GPU's energy split between its instances.

On a GPU in MIG mode, device-level GPM needs root, and power is measured for the whole
GPU only. Each read samples every GPU instance with `nvmlGpmMigSampleGet` (one sample
and one `nvmlGpmMetricsGet` per instance, as for a whole GPU), and splits the GPU's
sampled energy since the previous read between its instances by activity:

    E_i = ΔE × (slices_i / 7) × sm_active_i        idle = ΔE − Σ E_i

`slices_i / 7` is the instance's share of the GPU's compute slices, `sm_active_i` (0-1)
the share of time its own SMs had work, so a 7g instance at full activity gets all of
ΔE and an idle GPU gives all of it to `gpu_instance="idle"`: the idle and static power,
and the activity of an instance in its first interval (no GPM reading yet). The parts
add up to ΔE by construction; see docs/metrics.md (MIG) for what the split can and
cannot say.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.collectors.mig.reading import MIG_SLICES, read_mig_devices
from exporter.gpu import gpm
from exporter.sampling.collector_api import CollectorContext

__all__ = ["IDLE_INSTANCE", "MigEnergy", "MigProfiler", "split_by_activity"]

IDLE_INSTANCE = "idle"
#: The activity the energy is split by.
SPLIT_KEY = "sm_active_ratio"


@dataclass(frozen=True)
class MigEnergy:
    instances: Mapping[int, float]  # GPU instance -> joules attributed since it was seen
    idle: float  # the rest of the GPU's energy over the same time


def split_by_activity(delta: float, activity: Mapping[int, tuple[int, float]]
                      ) -> tuple[dict[int, float], float]:
    """ΔE split between GPU instances: (instance -> joules, the rest). `activity` maps an
    instance to (its slices, its SM activity 0-1); weights past a sum of 1 (bad data)
    are scaled to 1, a negative or NaN activity counts as 0."""
    weights = {}
    for gi, (slices, active) in activity.items():
        share = min(max(slices, 0), MIG_SLICES) / MIG_SLICES
        weights[gi] = share * active if active > 0 else 0.0
    total = sum(weights.values())
    scale = 1.0 / total if total > 1.0 else 1.0
    out = {gi: delta * w * scale for gi, w in weights.items()}
    return out, max(0.0, delta - sum(out.values()))


@dataclass
class _GpuEnergy:
    baseline: float | None = None  # the GPU's sampled energy at the last split
    idle: float = 0.0
    instances: dict[int, float] = field(default_factory=dict)


class MigProfiler:
    """The per-instance readers of every MIG GPU, and their energy split."""

    def __init__(self, context: CollectorContext) -> None:
        self.context = context
        self._readers: dict[tuple[int, int], gpm.GpmMigReader] = {}
        self._energy: dict[int, _GpuEnergy] = {}

    def instances(self, gpu: int) -> dict[int, int] | None:
        """The GPU's instances (GPU instance -> slices) when it is in MIG mode, else None."""
        backend = self.context.backend
        if backend is None:
            return None
        mode, devices = read_mig_devices(backend, gpu)
        if not mode:
            return None
        return {d.gpu_instance: d.slices for d in devices}

    def read(self, gpu: int, instances: Mapping[int, int], now: float
             ) -> tuple[str, dict[int, gpm.GpmReading], MigEnergy]:
        """(the support status, this read's per-instance intervals, the energy split)."""
        backend = self.context.backend
        assert backend is not None
        for key in [k for k in self._readers if k[0] == gpu and k[1] not in instances]:
            self._readers.pop(key).close()  # the instance was destroyed
        readings: dict[int, gpm.GpmReading] = {}
        status = gpm.ERROR
        for gi in sorted(instances):
            reader = self._readers.get((gpu, gi))
            if reader is None:
                reader = self._readers[(gpu, gi)] = gpm.GpmMigReader(backend, gpu, gi)
            reading = reader.read(now)
            status = reader.support()
            if reading is not None:
                readings[gi] = reading
        return status, readings, self._split(gpu, instances, readings)

    def _split(self, gpu: int, instances: Mapping[int, int],
               readings: Mapping[int, gpm.GpmReading]) -> MigEnergy:
        account = self._energy.setdefault(gpu, _GpuEnergy())
        account.instances = {gi: account.instances.get(gi, 0.0) for gi in instances}
        energy = self.context.energy_joules(gpu)
        if energy is not None and account.baseline is not None and energy >= account.baseline:
            activity = {gi: (instances[gi], r.values.get(SPLIT_KEY, 0.0))
                        for gi, r in readings.items()}
            parts, rest = split_by_activity(energy - account.baseline, activity)
            for gi, joules in parts.items():
                account.instances[gi] += joules
            account.idle += rest
        account.baseline = energy  # a first read, or a reset (the GPU came back): baseline
        return MigEnergy(MappingProxyType(dict(account.instances)), account.idle)

    def restart(self, gpu: int) -> None:
        """The GPU was unreadable: its next intervals and energy start afresh."""
        for (g, _), reader in self._readers.items():
            if g == gpu:
                reader.restart()
        if gpu in self._energy:
            self._energy[gpu].baseline = None

    def forget(self, gpu: int) -> None:
        """The GPU left MIG mode: free its instances' buffers."""
        for key in [k for k in self._readers if k[0] == gpu]:
            self._readers.pop(key).close()
        self._energy.pop(gpu, None)

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers = {}
