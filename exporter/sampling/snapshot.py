"""The snapshot contract: everything one rendering (or one API answer) needs, immutable.

This is the only thing the renderers and the HTTP side import from sampling: they never
see threads, NVML or buffers being written.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from exporter.gpu.board import BoardRead
from exporter.gpu.device_read import DeviceRead
from exporter.gpu.reading import GpuIdentity, GpuReading
from exporter.sampling.buffers import PowerRingView
from exporter.sampling.live_goodput import GoodputAnalysis
from exporter.sampling.live_power import PowerAnalysis
from exporter.sampling.live_stragglers import StragglerAnalysis


@dataclass(frozen=True)
class LoopStats:
    """How well a periodic loop keeps its schedule."""

    target_hertz: float
    iterations_total: int
    overruns_total: int  # ticks skipped because an iteration ran past the next one
    achieved_hertz: float  # over the last few seconds
    jitter_p99_seconds: float  # lateness of tick starts against the schedule
    last_completed: float  # epoch seconds, 0 if never
    busy: str = ""  # what the loop is doing right now, when it is inside a call
    last_duration_seconds: float = 0.0
    cpu_seconds_total: float = 0.0
    restarts_total: int = 0


@dataclass(frozen=True)
class CollectorResult:
    reading: object  # the last successful reading (None if never); the collector's type
    duration_seconds: float
    success: bool
    errors_total: int
    error: str = ""
    stuck_seconds: float = 0.0  # how long the current read has been running, if stuck
    last_success: float = 0.0  # epoch seconds


@dataclass(frozen=True)
class XidRecord:
    count: int
    last_seen: float  # epoch seconds


@dataclass(frozen=True)
class XidSourceStats:
    """How the two XID sources fare (sampling/xid_ledger.py)."""

    duplicates: int  # XIDs both NVML's events and the kernel log reported, counted once
    kmsg_read: bool  # whether the kernel log is read at all
    kmsg_xids: int  # XID lines read from it, refused ones too
    kmsg_readable: bool | None  # None: not tried yet
    kmsg_skipped: int = 0  # records skipped whole: too long, or numbered past 64 bits


@dataclass(frozen=True)
class PowerReading:
    time: float  # epoch seconds: the driver's timestamp of the sample
    watts: float


@dataclass(frozen=True)
class PowerSamplingStats:
    """Where a GPU's power samples come from and how well they arrive."""

    kind: str  # "buffer": the driver's sample buffer; "poll": the instant-power field
    sample_interval_seconds: float | None  # median interval between samples
    samples_total: int
    lost_total: int  # samples the driver's buffer dropped before we drained it
    gap_seconds_total: float  # time those lost samples covered
    sampled_energy_joules: float  # the samples integrated over time (ours, not the driver's)


@dataclass(frozen=True)
class Snapshot:
    time: float
    started_at: float
    backend: str  # "nvml", "fake" or "replay"
    scenario: str
    driver_version: str
    nvml_version: str
    bindings_version: str
    gpu_count: int
    expected_gpus: int
    identities: tuple[GpuIdentity | None, ...]
    readings: Mapping[int, GpuReading]  # the sweep's values of each GPU
    power: Mapping[int, PowerReading]  # the latest sample of each GPU
    power_sampling: Mapping[int, PowerSamplingStats]
    loops: Mapping[str, LoopStats]
    nvml_errors: Mapping[tuple[str, str], int]
    collectors: Mapping[str, CollectorResult] = field(default_factory=dict)
    power_buffer_bytes: int = 0
    # each GPU's device reads (ECC, row remapping, NVLink, PCIe, recovery action:
    # gpu/device_read.py), every --sweep.health-interval; what the health checks judge
    device_reads: Mapping[int, DeviceRead] = field(default_factory=dict)
    # fabric and InfoROM, read once a minute; kept for a lost GPU (its identity's labels)
    board: Mapping[int, BoardRead] = field(default_factory=dict)
    clock_event_seconds: Mapping[tuple[int, str], float] = field(default_factory=dict)
    # gpu -> PCIe bytes per second (sent, received) between the sweep's last two reads
    pcie_rates: Mapping[int, tuple[float | None, float | None]] = field(default_factory=dict)
    xids: Mapping[tuple[int, int], XidRecord] = field(default_factory=dict)  # (gpu, code)
    xid_events_registered: int = 0
    xid_sources: XidSourceStats | None = None
    lost: frozenset[int] = frozenset()  # GPUs NVML reports lost (GpuIsLost)
    hung: Mapping[int, float] = field(default_factory=dict)  # GPU stuck in a call -> since
    recovery_attempts: Mapping[int, int] = field(default_factory=dict)
    recoveries: Mapping[int, int] = field(default_factory=dict)
    hangs: Mapping[int, int] = field(default_factory=dict)
    power_analysis: PowerAnalysis | None = None
    straggler_analysis: StragglerAnalysis | None = None
    goodput: GoodputAnalysis | None = None
    power_update_periods: Mapping[int, float] = field(default_factory=dict)  # polled sensors
    observable_band_hz: tuple[float, float] = (0.0, 0.0)
    # the native samples, read-only and as of this snapshot (the live page's windows)
    power_ring: PowerRingView | None = None

    def __post_init__(self) -> None:
        # read-only views: whoever renders or serves a snapshot cannot change it
        for name in _FIELD_NAMES:
            value = getattr(self, name)
            if isinstance(value, dict):
                object.__setattr__(self, name, MappingProxyType(value))

    def with_goodput(self, goodput: GoodputAnalysis | None) -> Snapshot:
        """The same snapshot with another goodput account: dataclasses.replace's result
        without its work (every field passed again and its views checked), as the
        snapshot is settled every second (Sampler.settle)."""
        out = copy.copy(self)
        object.__setattr__(out, "goodput", goodput)
        return out

    def up(self, gpu: int) -> bool:
        return (gpu not in self.lost and gpu not in self.hung
                and self.identities[gpu] is not None)


_FIELD_NAMES = tuple(f.name for f in fields(Snapshot))
