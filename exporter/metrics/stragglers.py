"""Straggler and stall families: per-GPU window features, peer scores, findings, stalls."""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.metrics.exposition import Rows
from exporter.metrics.gpu import GPU_LABELS
from exporter.sampling.snapshot import Snapshot

# (metric, help, GpuFeatures attribute): the window features rules compare across nodes
FEATURES = (
    ("gpu_window_sm_clock_hertz", "Mean SM clock over the straggler window (60 s).",
     "sm_clock_hertz"),
    ("gpu_window_power_watts", "Mean power over the straggler window.", "power_watts"),
    ("gpu_window_temperature_celsius", "Mean temperature over the straggler window.",
     "temperature_celsius"),
    ("gpu_window_utilization_ratio", "Mean utilization over the straggler window.",
     "utilization_ratio"),
    ("gpu_window_duty_cycle_ratio", "Share of the window in the high-power (compute) phase; "
     "a straggler computes longer while its peers wait.", "duty_cycle"),
    ("gpu_window_throttle_ratio", "Share of the window with a throttle reason (SW power "
     "cap, HW slowdown, SW/HW thermal, power brake) active: SW power cap and SW thermal "
     "from the driver's violation counters where read.", "throttle_ratio"),
    ("gpu_window_compute_ratio", "Mean compute share over the straggler window: the busiest "
     "math pipe's share of the time (GPM); a straggler computes while its peers wait.",
     "compute_ratio"),
)


def _labels(snapshot: Snapshot, gpu: int) -> list[str] | None:
    ident = snapshot.identities[gpu] if gpu < len(snapshot.identities) else None
    if ident is None or not snapshot.up(gpu):
        return None
    return [str(gpu), ident.uuid]


def straggler_families(snapshot: Snapshot) -> Iterator[Metric]:
    analysis = snapshot.straggler_analysis
    if analysis is None:
        return
    features = analysis.features
    families = {name: Rows(name, doc, "gauge", GPU_LABELS) for name, doc, _ in FEATURES}
    if features is not None:
        for gpu, f in sorted(features.gpus.items()):
            labels = _labels(snapshot, gpu)
            if labels is None:
                continue
            for name, _, attr in FEATURES:
                value = getattr(f, attr)
                if value is not None and math.isfinite(value):
                    families[name].add(tuple(labels), value)
    yield from families.values()

    report = analysis.report
    score = Rows("gpu_straggler_score", "Modified z-score of a signal against the GPU's "
                 "peers: 0.6745 (x - median) / MAD.", "gauge", [*GPU_LABELS, "signal"])
    flag = GaugeMetricFamily("gpu_straggler", "1 when the GPU deviates from its peers on a "
                             "signal for longer than the persistence (5 min).",
                             labels=GPU_LABELS)
    signal = GaugeMetricFamily("gpu_straggler_signal", "1 for each signal that made the GPU "
                               "a straggler; `direction` low or high.",
                               labels=[*GPU_LABELS, "signal", "direction"])
    since = GaugeMetricFamily("gpu_straggler_since_timestamp_seconds",
                              "When the GPU's current finding began (Unix time).",
                              labels=GPU_LABELS)
    peers = GaugeMetricFamily("gpu_node_straggler_peer_statistics",
                              "1 if the node (or a job on it) has the 3 or more GPUs peer "
                              "statistics need.")
    if report is not None:
        peers.add_metric([], 1.0 if report.peer_statistics else 0.0)
        for gpu, g in sorted(report.gpus.items()):
            labels = _labels(snapshot, gpu)
            if labels is None:
                continue
            flag.add_metric(labels, 1.0 if g.straggler else 0.0)
            if g.since is not None and g.straggler:
                since.add_metric(labels, g.since)
            for name, sc in sorted(g.scores.items()):
                if math.isfinite(sc.score):
                    score.add((*labels, name), sc.score)
                if sc.finding:
                    signal.add_metric([*labels, name, sc.direction or ""], 1.0)
    yield from (score, flag, signal, since, peers)
    yield from _stall_families(snapshot, analysis)


def _stall_families(snapshot: Snapshot, analysis) -> Iterator[Metric]:
    stall = analysis.stall
    yield GaugeMetricFamily("gpu_node_collective_stall_active", "1 while peers busy-wait (high "
                            "utilization, low power) and one GPU differs: a stall.",
                            value=1.0 if stall is not None and stall.stalled else 0.0)
    yield CounterMetricFamily("gpu_node_collective_stalls", "Stalls seen (each episode once).",
                              value=analysis.stalls_total)
    yield CounterMetricFamily("gpu_node_collective_stall_seconds", "Seconds spent stalled.",
                              value=analysis.stall_seconds_total)
    culprit = GaugeMetricFamily("gpu_collective_stall_culprit", "1 while the GPU is the "
                                "likely culprit of a stall (idle, or still computing, while "
                                "its peers wait).", labels=GPU_LABELS)
    waiting = GaugeMetricFamily("gpu_collective_stall_waiting", "1 while the GPU busy-waits "
                                "in a stall.", labels=GPU_LABELS)
    culprit_seconds = CounterMetricFamily("gpu_collective_stall_culprit_seconds",
                                          "Seconds the GPU was a stall's culprit.",
                                          labels=GPU_LABELS)
    for gpu in range(snapshot.gpu_count):
        labels = _labels(snapshot, gpu)
        if labels is None:
            continue
        stalled = stall is not None and stall.stalled
        culprit.add_metric(labels, 1.0 if stalled and gpu in stall.culprit_gpus else 0.0)
        waiting.add_metric(labels, 1.0 if stalled and gpu in stall.waiting_gpus else 0.0)
        culprit_seconds.add_metric(labels, analysis.culprit_seconds.get(gpu, 0.0))
    yield from (culprit, waiting, culprit_seconds)
    yield GaugeMetricFamily("gpu_node_straggler_analysis_held", "1 while the last straggler window "
                            "was not analysed because the exporter sampled it badly (power "
                            "samples lost, sweeps skipped): findings are held as they were "
                            "and no window features are exported.",
                            value=1.0 if analysis.held else 0.0)
    coverage = GaugeMetricFamily("gpu_node_straggler_analysis_coverage_ratio", "How completely the "
                                 "last straggler window was sampled: the worst GPU's share "
                                 "with power samples, and the share of the expected sweeps.",
                                 labels=["data"])
    for data, share in sorted(analysis.coverage.items()):
        coverage.add_metric([data], share)
    yield coverage
    yield GaugeMetricFamily("cte_straggler_analysis_duration_seconds",
                            "What the last straggler/stall update cost.",
                            value=analysis.duration_seconds)
