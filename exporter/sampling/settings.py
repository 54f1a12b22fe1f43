"""The sampler's settings, and those of the live analyses it runs: each declared once
(flag, config key, default, range, help), so `run`, `simulate`, `record` and `analyze`
take them from here and cannot disagree.

The analyses themselves (exporter/analysis/) know no command or flag: they take the
thresholds these objects hold (`PowerSettings.swing_thresholds()`, ...)."""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.analysis.power_swing import SwingThresholds
from exporter.analysis.straggler import StragglerThresholds
from exporter.gpu.device_read import NvlinkReads
from exporter.options import (
    ALL,
    ANALYZE,
    RUN,
    SIMULATE,
    analyze_setting,
    band,
    positive,
    ratio,
    section,
    setting,
    whole_at_least_one,
)


@dataclass(frozen=True)
class PowerSettings:
    """The live power analysis (exporter/sampling/live_power.py); `analyze` takes the
    thresholds it shares as flags, and the two it alone applies (cycles, dips)."""

    window_seconds: float = analyze_setting(
        30.0, "step-scale window", "--window", positive, "SECONDS")
    update_seconds: float = 5.0
    band_hz: tuple[float, float] = analyze_setting(
        (0.1, 3.0), "swing band in Hz", "--band", band, "LOW-HIGH")
    min_amplitude_ratio: float = setting(
        0.20, "node swing amplitude / node TDP from which a swing matters to the grid (the "
        "swing alert and the findings' severity); every clear swing is reported whatever "
        "its size", key="power_min_amplitude_ratio", flag="--power.min-amplitude-ratio",
        low=0.0, high=1.0, metavar="R", commands=(RUN, SIMULATE, ANALYZE),
        command_flags={ANALYZE: "--min-amplitude-ratio"})
    min_band_energy_ratio: float = analyze_setting(
        0.20, "window swing: share of AC energy in the band", "--min-band-energy", ratio, "R")
    min_synchrony: float = analyze_setting(
        0.5, "window swing: GPU synchrony", "--min-synchrony", ratio, "R")
    hold_updates: int = analyze_setting(
        3, "window swing: consecutive windows required", "--hold", whole_at_least_one, "N")
    cycle_window_seconds: float = analyze_setting(
        600.0, "cycle-scale window", "--cycle-window", positive, "SECONDS")
    cycle_min_ratio: float = analyze_setting(
        0.05, "cycle: amplitude of the mean cycle / node TDP", "--cycle-min-ratio", ratio, "R")
    cycle_every_seconds: float = 60.0
    ramp_window_seconds: float = 60.0
    ramp_min_ratio: float = analyze_setting(
        0.30, "ramp: change / node TDP, or / observed range", "--ramp-ratio", ratio, "R")
    dip_min_ratio: float = analyze_setting(
        0.30, "dip (pause): fall / the node's power before it", "--dip-ratio", ratio, "R")
    segment_window_seconds: float = analyze_setting(
        120.0, "step swing in the compute plateaus: window split into plateaus and pauses",
        "--segment-window", positive, "SECONDS")
    # The step swing over a 2-minute window moves slowly: analysed every 15 s (a scrape
    # interval), not every update, it costs a third as much (~6 ms on 8 GPUs).
    step_every_seconds: float = 15.0

    def swing_thresholds(self) -> SwingThresholds:
        """When a window counts as a swing (analysis.power_swing.SwingThresholds)."""
        return SwingThresholds(self.min_amplitude_ratio, self.band_hz,
                               self.min_band_energy_ratio, self.min_synchrony)


@dataclass(frozen=True)
class StragglerSettings:
    """The live straggler and stall analysis (exporter/sampling/live_stragglers.py);
    `analyze` slides the same windows over a trace."""

    window_seconds: float = analyze_setting(
        60.0, "stragglers: window over which each GPU is compared with its peers",
        "--outlier-window", positive, "SECONDS", key="straggler_window_seconds")
    update_seconds: float = analyze_setting(
        10.0, "stragglers: window advance", "--outlier-step", positive, "SECONDS",
        key="straggler_update_seconds")
    persistence_seconds: float = setting(
        300.0, "how long a GPU must deviate from its peers to be a straggler",
        key="straggler_persistence_seconds", flag="--straggler.persistence", low=0.0,
        high=86400.0, metavar="SECONDS", commands=(RUN, SIMULATE, ANALYZE),
        command_flags={ANALYZE: "--persistence"})
    stall_window_seconds: float = analyze_setting(
        2.0, "stalls: short window for the busy-wait signature", "--stall-window", positive,
        "SECONDS")
    stall_context_seconds: float = analyze_setting(
        120.0, "stalls: span over which each GPU's compute power level is taken",
        "--stall-context", positive, "SECONDS")
    sweep_interval_seconds: float = 1.0  # what the sweep coverage is measured against

    def thresholds(self) -> StragglerThresholds:
        """When a GPU deviates from its peers (analysis.straggler.StragglerThresholds)."""
        return StragglerThresholds(persistence_seconds=self.persistence_seconds)


@dataclass(frozen=True)
class SamplerSettings:
    power_sample_rate_hz: float = setting(
        20.0, "polling rate of the instant-power field, used only for GPUs whose driver "
        "keeps no buffer of power samples (where it does, as on Hopper, every sample of "
        "the buffer is taken at the sensor's own rate and this is unused)",
        flag="--power.sample-rate", low=1.0, high=100.0,
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
    # 15 s, a scrape interval: these are counters and flags, so a longer interval loses
    # no event, only freshness; and the slow sweep holds the costliest fields (on an H200
    # ~2 ms a GPU: PCIe replays and bytes 80-170 us each, three clock-event violation
    # counters 0.4-0.7 ms each; docs/nvml-costs.md), 0.3 % of a core for 8 GPUs every 5 s.
    gpu_health_interval_seconds: float = setting(
        15.0, "how often ECC, row remapping, NVLink and PCIe counters are read",
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
    power_ring_seconds: float = 660.0
    # start() waits this long (or two sweep intervals, if longer) for the first values
    startup_wait_seconds: float = 2.0
    xid_events: bool = True
    kmsg_path: str = ""  # the kernel log read for XIDs; "": none
    nvlink_reads: NvlinkReads = field(default_factory=NvlinkReads)  # what the selection needs
