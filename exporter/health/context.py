"""What a GPU check reads: the snapshot's values for one GPU, the thresholds, and the
counter points for rates."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.gpu.device_read import DeviceRead
from exporter.gpu.reading import GpuReading
from exporter.health.counters import CounterPoints
from exporter.health.model import Outcome
from exporter.health.settings import HealthSettings
from exporter.sampling.snapshot import Snapshot


@dataclass(frozen=True)
class GpuInputs:
    snapshot: Snapshot
    gpu: int
    settings: HealthSettings
    counters: CounterPoints
    # the GPU's device read and sweep reading, looked up once for all its checks
    device_read: DeviceRead | None = field(init=False)
    reading: GpuReading | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_read", self.snapshot.device_reads.get(self.gpu))
        object.__setattr__(self, "reading", self.snapshot.readings.get(self.gpu))

    def value(self, key: str) -> float | None:
        """A catalogue value: the sweep's latest, or the GPU's static one (maxima)."""
        reading = self.reading
        found = reading.get(key) if reading is not None else None
        if found is None and self.gpu < len(self.snapshot.identities):
            ident = self.snapshot.identities[self.gpu]
            found = ident.values.get(key) if ident is not None else None
        return found

    def increase(self, name: str, time: float, value: float, window: float | None = None,
                 changes_only: bool = False) -> tuple[float, float] | None:
        """Record the counter's value at `time`; its (increase, seconds) over `window`
        (default: the health window, a minute)."""
        key = (self.gpu, name)
        window = self.settings.window_seconds if window is None else window
        self.counters.observe(key, time, value, window, changes_only)
        return self.counters.increase(key, window)


@dataclass(frozen=True)
class Check:
    """One check: its name (the `check` label), where its threshold comes from, and the
    function of the GPU's (or the node's) inputs that judges it."""

    name: str
    source: str
    judge: Callable[..., Outcome]
