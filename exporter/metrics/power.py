"""Power-swing families: the node's swing (no gpu label), each GPU's, cycles and ramps."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.analysis.power_swing import SwingFeatures
from exporter.metrics.exposition import Rows
from exporter.metrics.gpu import GPU_LABELS, gpu_labels
from exporter.sampling.live_power import PowerAnalysis
from exporter.sampling.snapshot import Snapshot

# (suffix, help, SwingFeatures attribute) exported for the node and for each GPU
FEATURES: tuple[tuple[str, str, str], ...] = (
    ("mean_watts", "Mean power over the window.", "mean_watts"),
    ("amplitude_watts", "Swing amplitude: p95 - p5 of power over the window.",
     "amplitude_watts"),
    ("amplitude_ratio", "Swing amplitude as a share of the power limit (TDP).",
     "amplitude_ratio"),
    ("frequency_hertz", "Dominant frequency of the oscillation (1 / step time).",
     "frequency_hz"),
    ("peak_concentration_ratio", "Share of the AC energy at the dominant frequency and its "
     "harmonics (1: a clean periodic swing).", "peak_concentration"),
    ("band_energy_ratio", "Share of the AC energy inside the configured band (0.1-3 Hz).",
     "band_energy_ratio"),
    ("max_ramp_watts_per_second", "Largest |dP/dt| after light smoothing.",
     "max_ramp_watts_per_second"),
    ("duty_cycle_ratio", "Share of the window above the midpoint of p5 and p95.",
     "duty_cycle"),
    ("phase_radians", "Phase of the node's dominant component at "
     "gpu_node_power_swing_phase_reference_timestamp_seconds, in (-pi, pi].", "phase_radians"),
)


# The step swing inside the compute plateaus (analysis.step_segments): the job's step rhythm.
STEP = "gpu_node_power_swing_step"
# (suffix, help, StepSwing attribute), exported while a clear swing is found
STEP_FEATURES: tuple[tuple[str, str, str], ...] = (
    ("period_seconds", "The node's step period: 1 / the frequency of the clear, coherent, "
     "periodic swing inside its compute plateaus (the rhythm of compute and communication; "
     "with gradient accumulation, the micro-step).", "period_seconds"),
    ("confidence_ratio", "1 - the chance that noise alone shows a spectral peak as clear as "
     "the step swing's.", "confidence"),
    ("significance_ratio", "The step swing's spectral peak over the noise floor of the "
     "plateau-averaged spectrum.", "significance"),
    ("amplitude_watts", "Peak-to-peak of the node's mean step waveform in the compute "
     "plateaus.", "amplitude_watts"),
    ("amplitude_ratio", "The step swing's amplitude as a share of the node's power limit "
     "(TDP).", "amplitude_ratio"),
    ("synchrony_ratio", "Coherence of the GPUs' components at the step frequency: 1 in "
     "phase, about 1/N independent.", "synchrony"),
    ("duty_ratio", "Share of the analysed compute time whose plateaus show the step swing.",
     "duty"),
    ("phase_radians", "Phase of the step swing in its last plateau at "
     f"{STEP}_phase_reference_timestamp_seconds, in (-pi, pi].", "phase_radians"),
    ("phase_reference_timestamp_seconds", "The Unix time the step phase refers to.",
     "phase_reference_time"),
)


def step_families(analysis: PowerAnalysis) -> Iterator[Metric]:
    """The step swing inside the compute plateaus: whether one is clear, whether it
    matters to the grid, and its features while it is."""
    step = analysis.step_swing
    yield GaugeMetricFamily(f"{STEP}_detected", "1 while a clear, coherent, periodic step "
                            "swing shows inside the node's compute plateaus (whatever its "
                            "amplitude).", value=0.0 if step is None else 1.0)
    yield GaugeMetricFamily(f"{STEP}_grid_relevant", "1 while that swing also passes the "
                            "amplitude threshold and lies in the critical band.",
                            value=1.0 if analysis.step_grid_relevant else 0.0)
    if step is None:
        return
    for suffix, doc, attr in STEP_FEATURES:
        value = getattr(step, attr)
        if value is not None:
            yield GaugeMetricFamily(f"{STEP}_{suffix}", doc, value=value)


def _add(family_by_suffix: dict[str, Rows], labels: tuple[str, ...],
         features: SwingFeatures) -> None:
    for suffix, _, attr in FEATURES:
        value = getattr(features, attr)
        if value is not None:
            family_by_suffix[suffix].add(labels, value)


def power_source_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Where each GPU's power samples come from, how fast, and what was lost."""
    labels = gpu_labels(snapshot)
    yield GaugeMetricFamily("gpu_node_power_observable_band_max_hertz",
                            "Highest frequency the exporter can see: half the effective "
                            "sample rate of the slowest GPU.",
                            value=snapshot.observable_band_hz[1])
    source = InfoMetricFamily("gpu_power_source", "Where the GPU's power samples come from: "
                              "buffer (the driver's sample buffer, drained) or poll (the "
                              "instant-power field, polled); value 1.",
                              labels=[*GPU_LABELS, "source"])
    interval = GaugeMetricFamily("gpu_power_sample_interval_seconds", "Median interval "
                                 "between the GPU's recent power samples.", labels=GPU_LABELS)
    samples = CounterMetricFamily("gpu_power_samples", "Power samples received.",
                                  labels=GPU_LABELS)
    lost = CounterMetricFamily("gpu_power_samples_lost", "Power samples the driver's buffer "
                               "dropped before the exporter drained it (a starved or stalled "
                               "exporter).", labels=GPU_LABELS)
    gap = CounterMetricFamily("gpu_power_sample_gap_seconds", "Time covered by lost power "
                              "samples.", labels=GPU_LABELS)
    energy = CounterMetricFamily("gpu_power_sampled_energy_joules", "The power samples "
                                 "integrated over time since the exporter started (fresh at "
                                 "every snapshot; the driver's counter is gpu_energy_joules).",
                                 labels=GPU_LABELS)
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
    period = GaugeMetricFamily("gpu_power_sensor_update_period_seconds",
                               "How often a polled GPU's instant-power field changes, "
                               "measured at start.", labels=GPU_LABELS)
    for gpu, seconds in sorted(snapshot.power_update_periods.items()):
        if gpu in labels:
            period.add_metric(labels[gpu], seconds)
    yield period


def power_families(snapshot: Snapshot) -> Iterator[Metric]:
    analysis = snapshot.power_analysis
    swing = analysis.swing if analysis is not None else None
    yield from power_source_families(snapshot)
    if analysis is None:
        return

    yield GaugeMetricFamily("gpu_node_power_swing_active", "1 while the node's GPUs swing in step: "
                            "amplitude, frequency band, band energy and synchrony past their "
                            "thresholds for consecutive updates.",
                            value=1.0 if analysis.swinging else 0.0)
    yield GaugeMetricFamily("gpu_node_power_swing_window_seconds", "Length of the analysed window.",
                            value=analysis.window_seconds)
    node = {suffix: Rows(f"gpu_node_power_swing_{suffix}", f"Node (sum of GPUs): {doc}",
                         "gauge", ())
            for suffix, doc, _ in FEATURES}
    gpus = {suffix: Rows(f"gpu_power_swing_{suffix}", f"Per GPU: {doc}", "gauge", GPU_LABELS)
            for suffix, doc, _ in FEATURES}
    if swing is not None:
        _add(node, (), swing.node)
        for gpu, features in sorted(swing.gpus.items()):
            ident = snapshot.identities[gpu]
            if ident is not None and gpu not in snapshot.lost and gpu not in snapshot.hung:
                _add(gpus, (str(gpu), ident.uuid), features)
    yield from node.values()
    yield from gpus.values()
    if swing is not None:
        yield GaugeMetricFamily("gpu_node_power_swing_synchrony_ratio",
                                "var(sum P) / (N * sum var P): 1 when all GPUs swing in phase, "
                                "about 1/N when independent.",
                                value=swing.synchrony)
        yield GaugeMetricFamily("gpu_node_power_swing_phase_reference_timestamp_seconds",
                                "The Unix time the phases refer to. Phase now = phase + "
                                "2 pi f (time() - this).", value=swing.phase_reference_time)

    yield from step_families(analysis)

    cycle = analysis.cycle
    yield GaugeMetricFamily("gpu_node_power_cycle_detected", "1 if a slow periodic pattern (e.g. "
                            "checkpoints) shows in the last 10 minutes.",
                            value=0.0 if cycle is None else 1.0)
    if cycle is not None:
        for name, doc, value in (
                ("gpu_node_power_cycle_period_seconds", "Period of the slow pattern.",
                 cycle.period_seconds),
                ("gpu_node_power_cycle_amplitude_watts", "Node power range over the mean cycle.",
                 cycle.amplitude_watts),
                ("gpu_node_power_cycle_amplitude_ratio",
                 "Cycle amplitude as a share of the node's TDP.",
                 cycle.amplitude_ratio),
                ("gpu_node_power_cycle_strength_ratio",
                 "How regular the pattern is (autocorrelation at the period, 0-1).",
                 cycle.strength),
                ("gpu_node_power_cycle_synchrony_ratio", "Synchrony of the GPUs' mean cycles.",
                 cycle.synchrony)):
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=value)

    ramps = CounterMetricFamily("gpu_node_power_ramps", "Large synchronised rises and falls of the "
                                "node's power (job start, stop, crash).", labels=["direction"])
    for direction, count in sorted(analysis.ramps_total.items()):
        ramps.add_metric([direction], count)
    yield ramps
    ramp = analysis.last_ramp
    if ramp is not None:
        yield GaugeMetricFamily("gpu_node_power_ramp_last_delta_watts",
                                "Size of the last large ramp (negative for a fall).",
                                value=ramp.delta_watts)
        yield GaugeMetricFamily("gpu_node_power_ramp_last_timestamp_seconds", "When it happened.",
                                value=ramp.time)
        yield GaugeMetricFamily("gpu_node_power_ramp_last_duration_seconds", "How long it took "
                                "(10-90 %).", value=ramp.duration_seconds)
    yield GaugeMetricFamily("cte_power_analysis_duration_seconds",
                            "What the last power-analysis update cost.",
                            value=analysis.duration_seconds)
