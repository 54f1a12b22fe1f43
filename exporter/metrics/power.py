"""Power-swing families: the node's swing (no gpu label), each GPU's, cycles and ramps."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter.analysis.power_swing import SwingFeatures
from exporter.families import FULL, MINIMAL, STANDARD, Family
from exporter.metrics.exposition import Rows
from exporter.metrics.gpu import GPU_LABELS, gpu_labels
from exporter.sampling.live_power import PowerAnalysis
from exporter.sampling.snapshot import Snapshot

_GPU = tuple(GPU_LABELS)

OBSERVABLE_BAND = Family(
    "gpu_node_power_observable_band_max_hertz", "gauge",
    "Highest frequency the exporter can see: half the effective sample rate of the slowest "
    "GPU.", unit="Hz", source="sampler",
    doc="Highest swing frequency the exporter can see: half the effective sample rate of "
        "the slowest GPU (~25 Hz from an H200's sample buffer).")
SOURCE = Family(
    "gpu_power_source_info", "info",
    "Where the GPU's power samples come from: buffer (the driver's sample buffer, drained) "
    "or poll (the instant-power field, polled); value 1.", (*_GPU, "source"),
    source="start-up probe of `nvmlDeviceGetSamples`",
    doc="Where the GPU's power samples come from: `buffer` (the driver's sample buffer, "
        "drained) or `poll` (the instant field, polled where the driver keeps no buffer).")
SAMPLE_INTERVAL = Family(
    "gpu_power_sample_interval_seconds", "gauge",
    "Median interval between the GPU's recent power samples.", _GPU, unit="s",
    source="the samples' timestamps", profile=FULL,
    doc="Median interval between the GPU's recent power samples (~0.02 s from an H200's "
        "buffer).")
SAMPLES = Family(
    "gpu_power_samples_total", "counter", "Power samples received.", _GPU, source="sampler",
    profile=FULL)
SAMPLES_LOST = Family(
    "gpu_power_samples_lost_total", "counter",
    "Power samples the driver's buffer dropped before the exporter drained it (a starved or "
    "stalled exporter).", _GPU, source="sampler",
    doc="Samples the driver's buffer (~2.4 s on an H200) dropped before the exporter "
        "drained it: the exporter was starved or stalled.")
SAMPLE_GAP = Family(
    "gpu_power_sample_gap_seconds_total", "counter", "Time covered by lost power samples.",
    _GPU, unit="s", source="sampler", doc="Time covered by lost samples.")
SAMPLED_ENERGY = Family(
    "gpu_power_sampled_energy_joules_total", "counter",
    "The power samples integrated over time since the exporter started (fresh at every "
    "snapshot; the driver's counter is gpu_energy_joules).", _GPU, unit="J",
    source="sampler",
    doc="The power samples integrated over time since the exporter started: fresh at every "
        "snapshot, apart from the driver's counter (`gpu_energy_joules_total`); the two "
        "agree within ~1 % (tested).")
SENSOR_PERIOD = Family(
    "gpu_power_sensor_update_period_seconds", "gauge",
    "How often a polled GPU's instant-power field changes, measured at start.", _GPU,
    unit="s", source="start-up probe of field 186",
    doc="How often a polled GPU's instant-power field changes (present only for GPUs whose "
        "power is polled).")
SWING_ACTIVE = Family(
    "gpu_node_power_swing_active", "gauge",
    "1 while the node's GPUs swing in step: amplitude, frequency band, band energy and "
    "synchrony past their thresholds for consecutive updates.", source="`SwingDetector`",
    profile=MINIMAL,
    doc="1 while the node swings in step: amplitude >= 20 % of TDP, frequency in 0.1-3 Hz, "
        "band energy > 20 %, synchrony >= 0.5, for 3 consecutive updates.")
WINDOW = Family(
    "gpu_node_power_swing_window_seconds", "gauge", "Length of the analysed window.",
    unit="s", source="config", doc="Length of the analysed window (30 s).")



def _gauges(obj: object, features: tuple[tuple[str, Family], ...]) -> Iterator[Metric]:
    """One gauge per (attribute, family) whose attribute of `obj` is not None."""
    for attr, family in features:
        value = getattr(obj, attr)
        if value is not None:
            yield family.gauge(value)

def _feature(attr: str, suffix: str, unit: str, help_: str, node: tuple[str, str],
             gpu: tuple[str, str]) -> tuple[str, Family, Family]:
    """(SwingFeatures attribute, the node's family, each GPU's): one help for both, with
    `node` and `gpu` their (profile, docs description)."""
    return (attr,
            Family(f"gpu_node_power_swing_{suffix}", "gauge", f"Node (sum of GPUs): {help_}",
                   unit=unit, source="analysis", profile=node[0], doc=node[1]),
            Family(f"gpu_power_swing_{suffix}", "gauge", f"Per GPU: {help_}", _GPU,
                   unit=unit, source="analysis", profile=gpu[0], doc=gpu[1]))


# exported for the node and for each GPU
FEATURES = (
    _feature("mean_watts", "mean_watts", "W", "Mean power over the window.",
             (STANDARD, "Node: mean power over the window."),
             (FULL, "Per GPU: mean power over the window.")),
    _feature("amplitude_watts", "amplitude_watts", "W",
             "Swing amplitude: p95 - p5 of power over the window.",
             (MINIMAL, "Node: p95 - p5 of the summed power."), (STANDARD, "Per GPU: p95 - p5.")),
    _feature("amplitude_ratio", "amplitude_ratio", "ratio",
             "Swing amplitude as a share of the power limit (TDP).",
             (STANDARD, "Node amplitude as a share of the GPUs' summed TDP."),
             (FULL, "Per GPU: amplitude / TDP.")),
    _feature("frequency_hz", "frequency_hertz", "Hz",
             "Dominant frequency of the oscillation (1 / step time).",
             (MINIMAL, "Node: dominant frequency (1 / step time); absent when the power is "
                       "flat."),
             (FULL, "Per GPU: dominant frequency.")),
    _feature("peak_concentration", "peak_concentration_ratio", "ratio",
             "Share of the AC energy at the dominant frequency and its harmonics (1: a clean "
             "periodic swing).",
             (STANDARD, "Node: share of AC energy at the dominant frequency and harmonics."),
             (FULL, "Per GPU: energy at the dominant frequency.")),
    _feature("band_energy_ratio", "band_energy_ratio", "ratio",
             "Share of the AC energy inside the configured band (0.1-3 Hz).",
             (STANDARD, "Node: share of AC energy in the band (default 0.1-3 Hz)."),
             (FULL, "Per GPU: energy in the band.")),
    _feature("max_ramp_watts_per_second", "max_ramp_watts_per_second", "W/s",
             "Largest |dP/dt| after light smoothing.",
             (STANDARD, "Node: largest rate of change after light smoothing."),
             (STANDARD, "Per GPU: largest rate of change.")),
    _feature("duty_cycle", "duty_cycle_ratio", "ratio",
             "Share of the window above the midpoint of p5 and p95.",
             (STANDARD, "Node: share of the window in the high phase."),
             (FULL, "Per GPU: share of time in the high (compute) phase.")),
    _feature("phase_radians", "phase_radians", "rad",
             "Phase of the node's dominant component at "
             "gpu_node_power_swing_phase_reference_timestamp_seconds, in (-pi, pi].",
             (STANDARD, "Node: phase of the dominant component at the reference time."),
             (FULL, "Per GPU: phase at the node's dominant frequency.")),
)
SYNCHRONY = Family(
    "gpu_node_power_swing_synchrony_ratio", "gauge",
    "var(sum P) / (N * sum var P): 1 when all GPUs swing in phase, about 1/N when "
    "independent.", unit="ratio", source="analysis",
    doc="var(sum P) / (N sum var P): 1 in phase, ~1/N independent.")
PHASE_REFERENCE = Family(
    "gpu_node_power_swing_phase_reference_timestamp_seconds", "gauge",
    "The Unix time the phases refer to. Phase now = phase + 2 pi f (time() - this).",
    unit="s", source="analysis", doc="The Unix time the phases refer to.")

# The step swing inside the compute plateaus (analysis.step_segments): the job's step rhythm.
STEP = "gpu_node_power_swing_step"
_CLEAR = " (present only when a step swing is clear)"
STEP_DETECTED = Family(
    f"{STEP}_detected", "gauge",
    "1 while a clear, coherent, periodic step swing shows inside the node's compute "
    "plateaus (whatever its amplitude).", source="`find_step_swing`",
    doc="1 while a clear, coherent, periodic step swing shows inside the node's compute "
        "plateaus (last 120 s, pauses left out), whatever its amplitude.")
STEP_GRID_RELEVANT = Family(
    f"{STEP}_grid_relevant", "gauge",
    "1 while that swing also passes the amplitude threshold and lies in the swing band.",
    source="`find_step_swing`",
    doc="1 while that swing also passes the amplitude threshold (20 % of TDP) and lies in "
        "the swing band (`--band`, 0.1-3 Hz).")


def _step(attr: str, suffix: str, unit: str, help_: str, doc: str) -> tuple[str, Family]:
    """(StepSwing attribute, its family), exported while a clear swing is found."""
    return attr, Family(f"{STEP}_{suffix}", "gauge", help_, unit=unit,
                        source="`find_step_swing`", doc=doc + _CLEAR)


STEP_FEATURES = (
    _step("period_seconds", "period_seconds", "s",
          "The node's step period: 1 / the frequency of the clear, coherent, periodic swing "
          "inside its compute plateaus (the rhythm of compute and communication; with "
          "gradient accumulation, the micro-step).",
          "The node's step period: 1 / the step swing's frequency (the rhythm of compute and "
          "communication; with gradient accumulation the micro-step)."),
    _step("confidence", "confidence_ratio", "ratio",
          "1 - the chance that noise alone shows a spectral peak as clear as the step "
          "swing's.",
          "1 - the chance that noise alone gives a peak that clear (reported from 0.9999)."),
    _step("significance", "significance_ratio", "ratio",
          "The step swing's spectral peak over the noise floor of the plateau-averaged "
          "spectrum.",
          "The swing's spectral peak over the noise floor of the plateau-averaged spectrum."),
    _step("amplitude_watts", "amplitude_watts", "W",
          "Peak-to-peak of the node's mean step waveform in the compute plateaus.",
          "Peak-to-peak of the node's mean step waveform in the plateaus."),
    _step("amplitude_ratio", "amplitude_ratio", "ratio",
          "The step swing's amplitude as a share of the node's power limit (TDP).",
          "That amplitude as a share of the GPUs' summed TDP."),
    _step("synchrony", "synchrony_ratio", "ratio",
          "Coherence of the GPUs' components at the step frequency: 1 in phase, about 1/N "
          "independent.",
          "Coherence of the GPUs' components at the step frequency: 1 in phase, ~1/N "
          "independent."),
    _step("duty", "duty_ratio", "ratio",
          "Share of the analysed compute time whose plateaus show the step swing.",
          "Share of the analysed compute time whose plateaus show the swing."),
    _step("phase_radians", "phase_radians", "rad",
          f"Phase of the step swing in its last plateau at "
          f"{STEP}_phase_reference_timestamp_seconds, in (-pi, pi].",
          "Phase of the step swing in its last plateau at the reference time."),
    _step("phase_reference_time", "phase_reference_timestamp_seconds", "s",
          "The Unix time the step phase refers to.",
          "The Unix time the step phase refers to (same grid as the window's)."),
)

_CYCLE = " (present only when a cycle is detected)"
CYCLE_DETECTED = Family(
    "gpu_node_power_cycle_detected", "gauge",
    "1 if a slow periodic pattern (e.g. checkpoints) shows in the last 10 minutes.",
    source="`analyse_cycles`", profile=MINIMAL,
    doc="1 if a slow periodic pattern (e.g. checkpoints, 10 s to minutes) shows in the last "
        "10 minutes.")


def _cycle(attr: str, name: str, unit: str, help_: str, doc: str) -> tuple[str, Family]:
    """(the cycle's attribute, its family), exported while a cycle is detected."""
    return attr, Family(name, "gauge", help_, unit=unit, source="`analyse_cycles`",
                        doc=f"{doc}{_CYCLE}.")


CYCLE_FEATURES = (
    _cycle("period_seconds", "gpu_node_power_cycle_period_seconds", "s",
           "Period of the slow pattern.", "Its period"),
    _cycle("amplitude_watts", "gpu_node_power_cycle_amplitude_watts", "W",
           "Node power range over the mean cycle.", "Node power range over the mean cycle"),
    _cycle("amplitude_ratio", "gpu_node_power_cycle_amplitude_ratio", "ratio",
           "Cycle amplitude as a share of the node's TDP.", "As a share of the node's TDP"),
    _cycle("strength", "gpu_node_power_cycle_strength_ratio", "ratio",
           "How regular the pattern is (autocorrelation at the period, 0-1).",
           "Regularity, autocorrelation at the period"),
    _cycle("synchrony", "gpu_node_power_cycle_synchrony_ratio", "ratio",
           "Synchrony of the GPUs' mean cycles.", "Synchrony of the GPUs' mean cycles"),
)

_RAMP = " (present only when a ramp was seen)."
RAMPS = Family(
    "gpu_node_power_ramps_total", "counter",
    "Large synchronised rises and falls of the node's power (job start, stop, crash).",
    ("direction",), source="`detect_ramps`",
    doc="Large synchronised rises and falls of the node's power (>= 30 % of its TDP within "
        "5 s): job start, stop, crash.")
RAMP_DELTA = Family(
    "gpu_node_power_ramp_last_delta_watts", "gauge",
    "Size of the last large ramp (negative for a fall).", unit="W", source="`detect_ramps`",
    doc="Size of the last ramp, negative for a fall" + _RAMP)
RAMP_TIME = Family(
    "gpu_node_power_ramp_last_timestamp_seconds", "gauge", "When it happened.", unit="s",
    source="`detect_ramps`", doc="When" + _RAMP)
RAMP_DURATION = Family(
    "gpu_node_power_ramp_last_duration_seconds", "gauge", "How long it took (10-90 %).",
    unit="s", source="`detect_ramps`", doc="10-90 % duration" + _RAMP)
DURATION = Family(
    "cte_power_analysis_duration_seconds", "gauge", "What the last power-analysis update cost.",
    unit="s", source="sampler", doc="What the last analysis update cost.")

DECLARED = (OBSERVABLE_BAND, SOURCE, SAMPLE_INTERVAL, SAMPLES, SAMPLES_LOST, SAMPLE_GAP,
            SAMPLED_ENERGY, SENSOR_PERIOD, SWING_ACTIVE, WINDOW,
            *(node for _, node, _ in FEATURES), SYNCHRONY, PHASE_REFERENCE,
            *(gpu for _, _, gpu in FEATURES), STEP_DETECTED, STEP_GRID_RELEVANT,
            *(family for _, family in STEP_FEATURES), CYCLE_DETECTED,
            *(family for _, family in CYCLE_FEATURES), RAMPS, RAMP_DELTA, RAMP_TIME,
            RAMP_DURATION, DURATION)


def step_families(analysis: PowerAnalysis) -> Iterator[Metric]:
    """The step swing inside the compute plateaus: whether one is clear, whether it
    matters to the grid, and its features while it is."""
    step = analysis.step_swing
    yield STEP_DETECTED.gauge(0.0 if step is None else 1.0)
    yield STEP_GRID_RELEVANT.gauge(1.0 if analysis.step_grid_relevant else 0.0)
    if step is None:
        return
    yield from _gauges(step, STEP_FEATURES)


def _add(rows: list[Rows], labels: tuple[str, ...], features: SwingFeatures) -> None:
    for family, (attr, _, _) in zip(rows, FEATURES, strict=True):
        value = getattr(features, attr)
        if value is not None:
            family.add(labels, value)


def power_source_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Where each GPU's power samples come from, how fast, and what was lost."""
    labels = gpu_labels(snapshot)
    yield OBSERVABLE_BAND.gauge(snapshot.observable_band_hz[1])
    source, interval = SOURCE.info(by=_GPU), SAMPLE_INTERVAL.gauge()
    samples, lost, gap, energy = (SAMPLES.counter(), SAMPLES_LOST.counter(),
                                  SAMPLE_GAP.counter(), SAMPLED_ENERGY.counter())
    for gpu, stats in sorted(snapshot.power_sampling.items()):
        if gpu not in labels or not snapshot.up(gpu):
            continue
        source.add_metric([*labels[gpu]], {"source": stats.kind})
        if stats.sample_interval_seconds is not None:
            interval.add_metric(labels[gpu], stats.sample_interval_seconds)
        samples.add_metric(labels[gpu], stats.samples_total)
        lost.add_metric(labels[gpu], stats.lost_total)
        gap.add_metric(labels[gpu], stats.gap_seconds_total)
        energy.add_metric(labels[gpu], stats.sampled_energy_joules)
    yield from (source, interval, samples, lost, gap, energy)
    period = SENSOR_PERIOD.gauge()
    for gpu, seconds in sorted(snapshot.power_update_periods.items()):
        if gpu in labels:
            period.add_metric(labels[gpu], seconds)
    yield period


def power_families(snapshot: Snapshot) -> Iterator[Metric]:
    analysis = snapshot.power_analysis
    swing = analysis.window_swing if analysis is not None else None
    yield from power_source_families(snapshot)
    if analysis is None:
        return

    yield SWING_ACTIVE.gauge(1.0 if analysis.swinging else 0.0)
    yield WINDOW.gauge(analysis.window_seconds)
    node = [Rows.of(family) for _, family, _ in FEATURES]
    gpus = [Rows.of(family) for _, _, family in FEATURES]
    if swing is not None:
        _add(node, (), swing.node)
        for gpu, features in sorted(swing.gpus.items()):
            ident = snapshot.identities[gpu]
            if ident is not None and gpu not in snapshot.lost and gpu not in snapshot.hung:
                _add(gpus, (str(gpu), ident.uuid), features)
    yield from node
    yield from gpus
    if swing is not None:
        yield SYNCHRONY.gauge(swing.synchrony)
        yield PHASE_REFERENCE.gauge(swing.phase_reference_time)

    yield from step_families(analysis)

    cycle = analysis.cycle
    yield CYCLE_DETECTED.gauge(0.0 if cycle is None else 1.0)
    if cycle is not None:
        yield from _gauges(cycle, CYCLE_FEATURES)

    yield RAMPS.by_label(dict(sorted(analysis.ramps_total.items())))
    ramp = analysis.last_ramp
    if ramp is not None:
        yield RAMP_DELTA.gauge(ramp.delta_watts)
        yield RAMP_TIME.gauge(ramp.time)
        yield RAMP_DURATION.gauge(ramp.duration_seconds)
    yield DURATION.gauge(analysis.duration_seconds)
