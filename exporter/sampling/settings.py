"""The sampler's settings: each declared once (flag, config key, default, range, help),
so `run`, `simulate` and `record` take them from here and cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.analysis.live_power import PowerSettings
from exporter.analysis.live_stragglers import StragglerSettings
from exporter.gpu.health import NvlinkReads
from exporter.options import ALL, section, setting


@dataclass(frozen=True)
class SamplerSettings:
    power_sample_rate_hz: float = setting(
        20.0, "polling rate of the instant-power field, for GPUs whose driver keeps no "
        "buffer of power samples", flag="--power.sample-rate", low=1.0, high=100.0,
        metavar="HZ", commands=ALL)
    power_drain_interval_seconds: float = setting(
        1.0, "how often the driver's power-sample buffer is drained (it holds ~2.4 s)",
        flag="--power.drain-interval", low=0.1, high=2.0, metavar="SECONDS", commands=ALL)
    energy_interval_seconds: float = setting(
        30.0, "how often the energy counter is read (a ~4 ms call on Hopper)",
        flag="--energy.interval", low=1.0, high=3600.0, metavar="SECONDS", commands=ALL)
    sweep_interval_seconds: float = setting(
        1.0, "full GPU sweep and snapshot interval", flag="--sweep.interval", low=0.1,
        high=60.0, metavar="SECONDS", commands=ALL)
    gpu_health_interval_seconds: float = setting(
        5.0, "how often ECC, row remapping, NVLink and PCIe counters are read",
        flag="--sweep.health-interval", low=0.1, high=600.0, metavar="SECONDS", commands=ALL)
    gpu_board_interval_seconds: float = setting(
        60.0, "how often NVLink fabric registration and InfoROM validity are read (also "
        "at start)", flag="--sweep.board-interval", low=1.0, high=3600.0, metavar="SECONDS",
        commands=ALL)
    expected_gpus: int | None = setting(
        None, "GPUs this node should have (default: the count NVML reports at start)",
        flag="--gpus.expected", low=0, high=1024, metavar="N", optional=True)
    hang_timeout_seconds: float = setting(
        2.0, "an NVML call this long marks its GPU hung; sampling goes on without it",
        flag="--nvml.hang-timeout", low=0.2, high=600.0, metavar="SECONDS")
    gpu_recovery_interval_seconds: float = setting(
        10.0, "how often a lost GPU is tried again", low=0.1, high=3600.0)
    # collectors that do not say otherwise
    sources_interval_seconds: float = setting(
        5.0, "how often each collector (InfiniBand, host, jobs, ...) reads", low=0.5,
        high=600.0)
    # None: no analysis (record)
    stragglers: StragglerSettings | None = section(StragglerSettings)
    power: PowerSettings | None = section(PowerSettings)

    # Not settings: what the command wires in (no flag, no key).
    backend: str = "nvml"  # "nvml", "fake" or "replay"
    scenario: str = ""  # the fake's scenario or the replayed file
    power_history_seconds: float = 660.0
    # start() waits this long (or two sweep intervals, if longer) for the first values
    startup_wait_seconds: float = 2.0
    xid_events: bool = True
    nvlink_reads: NvlinkReads = field(default_factory=NvlinkReads)  # what the selection needs
