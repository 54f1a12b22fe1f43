"""Straggler and stall families: per-GPU window features, peer scores, outliers, stalls."""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter.families import FULL, MINIMAL, STANDARD, Family
from exporter.metrics.exposition import Rows
from exporter.metrics.gpu import GPU_LABELS
from exporter.sampling.snapshot import Snapshot

_GPU = tuple(GPU_LABELS)
_WINDOW = "straggler window"


def _feature(attr: str, name: str, help_: str, unit: str, doc: str, profile: str = STANDARD,
             source: str = _WINDOW) -> tuple[str, Family]:
    """(GpuFeatures attribute, its family): a mean or share over the straggler window."""
    return attr, Family(name, "gauge", help_, _GPU, unit=unit, source=source,
                        profile=profile, doc=doc)


# the window features rules compare across nodes
FEATURES = (
    _feature("sm_clock_hertz", "gpu_window_sm_clock_hertz",
             "Mean SM clock over the straggler window (60 s).", "Hz",
             "Mean SM clock over the last 60 s (for cross-node rules of a job)."),
    _feature("power_watts", "gpu_window_power_watts", "Mean power over the straggler window.",
             "W", "Mean power over the last 60 s."),
    _feature("temperature_celsius", "gpu_window_temperature_celsius",
             "Mean temperature over the straggler window.", "°C",
             "Mean temperature over the last 60 s.", profile=FULL),
    _feature("utilization_ratio", "gpu_window_utilization_ratio",
             "Mean utilization over the straggler window.", "ratio",
             "Mean utilization over the last 60 s.", profile=FULL),
    _feature("duty_cycle", "gpu_window_duty_cycle_ratio",
             "Share of the window in the high-power (compute) phase; a straggler computes "
             "longer while its peers wait.", "ratio",
             "Share of the window in the compute (high-power) phase; a straggler computes "
             "longer while its peers wait."),
    _feature("throttle_ratio", "gpu_window_throttle_ratio",
             "Share of the window with a throttle reason (SW power cap, HW slowdown, SW/HW "
             "thermal, power brake) active: SW power cap and SW thermal from the driver's "
             "violation counters where read.", "ratio",
             "Share of the window with a throttle reason active (SW power cap, HW slowdown, "
             "SW/HW thermal, power brake): SW power cap and SW thermal from the driver's "
             "violation counters where read, the rest from the reason bits each sweep.",
             profile=FULL),
    _feature("compute_ratio", "gpu_window_compute_ratio",
             "Mean compute share over the straggler window: the busiest math pipe's share of "
             "the time (GPM); a straggler computes while its peers wait.", "ratio",
             "Mean compute share over the window: the busiest math pipe's share of the time "
             "(the largest of `gpu_tensor_active_ratio` and the FP64/FP32/FP16 ratios), from "
             "the profiling intervals that end in it. A straggler computes while its peers "
             "wait in the collective. (present only when the profiling collector gives GPM "
             "metrics)", source=f"{_WINDOW}, profiling collector"),
)
SCORE = Family(
    "gpu_straggler_score", "gauge",
    "Modified z-score of a signal against the GPU's peers: 0.6745 (x - median) / MAD.",
    (*_GPU, "signal"), source="`StragglerDetector`",
    doc="Modified z-score of `signal` (`sm_clock`, `power`, `temperature`, `utilization`, "
        "`duty_cycle`, `throttle`, `compute` where GPM gives it) against the peers.")
STRAGGLER = Family(
    "gpu_straggler", "gauge",
    "1 when the GPU deviates from its peers on a signal for longer than the persistence "
    "(5 min).", _GPU, source="`StragglerDetector`", profile=MINIMAL,
    doc="1 when a signal deviated past the gates for the persistence.")
SIGNAL = Family(
    "gpu_straggler_signal", "gauge",
    "1 for each signal that made the GPU a straggler; `direction` low or high.",
    (*_GPU, "signal", "direction"), source="`StragglerDetector`",
    doc="1 for each outlying signal, `direction` `low` or `high` (present only "
        "when a GPU is a straggler).")
SINCE = Family(
    "gpu_straggler_since_timestamp_seconds", "gauge",
    "When the GPU's current outlier began (Unix time).", _GPU, unit="s",
    source="`StragglerDetector`",
    doc="When its earliest current outlier began (present only when a GPU is a straggler).")
PEER_STATISTICS = Family(
    "gpu_node_straggler_peer_statistics", "gauge",
    "1 if the node (or a job on it) has the 3 or more GPUs peer statistics need.",
    source="`StragglerDetector`", doc="1 if a group has the 3+ GPUs peer statistics need.")
HELD = Family(
    "gpu_node_straggler_analysis_held", "gauge",
    "1 while the last straggler window was not analysed because the exporter sampled it "
    "badly (power samples lost, sweeps skipped): outliers are held as they were and no "
    "window features are exported.", source="`StragglerMonitor`",
    doc="1 while the last straggler window was not analysed because the exporter sampled "
        "it badly (power samples lost before a drain, sweeps skipped: a starved exporter): "
        "outliers stay as they were and the `gpu_window_*` features are left out, so "
        "neither the node's outliers nor the job-level rules see the exporter's trouble as "
        "the GPUs'.")
COVERAGE = Family(
    "gpu_node_straggler_analysis_coverage_ratio", "gauge",
    "How completely the last straggler window was sampled: the worst GPU's share with "
    "power samples, and the share of the expected sweeps.", ("data",), unit="ratio",
    source="`StragglerMonitor`",
    doc='How completely the last window was sampled: `data="power"` the worst GPU\'s share '
        "of the window with power samples (held where a hole is longer than the straggler "
        "window bridges, a tenth of it, or holes fill more than half of it: "
        "docs/trace-format.md#gaps), `data=\"sweep\"` the share of the expected sweeps "
        "that came (held below 0.8).")
STALL_ACTIVE = Family(
    "gpu_node_collective_stall_active", "gauge",
    "1 while peers busy-wait (high utilization, low power) and one GPU differs: a stall.",
    source="stall check", profile=MINIMAL,
    doc="1 while the node's GPUs show the stall signature.")
STALLS = Family(
    "gpu_node_collective_stalls_total", "counter", "Stalls seen (each episode once).",
    source="stall check", doc="Stall episodes.")
STALL_SECONDS = Family(
    "gpu_node_collective_stall_seconds_total", "counter", "Seconds spent stalled.",
    unit="s", source="stall check", doc="Time spent stalled.")
CULPRIT = Family(
    "gpu_collective_stall_culprit", "gauge",
    "1 while the GPU is the likely culprit of a stall (idle, or still computing, while its "
    "peers wait).", _GPU, source="stall check",
    doc="1 while the GPU is the likely culprit (idle or still computing while its peers "
        "wait).")
WAITING = Family(
    "gpu_collective_stall_waiting", "gauge", "1 while the GPU busy-waits in a stall.", _GPU,
    source="stall check")
CULPRIT_SECONDS = Family(
    "gpu_collective_stall_culprit_seconds_total", "counter",
    "Seconds the GPU was a stall's culprit.", _GPU, unit="s", source="stall check")
DURATION = Family(
    "cte_straggler_analysis_duration_seconds", "gauge",
    "What the last straggler/stall update cost.", unit="s", source="sampler")

DECLARED = (*(family for _, family in FEATURES), SCORE, STRAGGLER, SIGNAL, SINCE,
            PEER_STATISTICS, HELD, COVERAGE, STALL_ACTIVE, STALLS, STALL_SECONDS, CULPRIT,
            WAITING, CULPRIT_SECONDS, DURATION)


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
    families = [(attr, Rows.of(family)) for attr, family in FEATURES]
    if features is not None:
        for gpu, f in sorted(features.gpus.items()):
            labels = _labels(snapshot, gpu)
            if labels is None:
                continue
            for attr, rows in families:
                value = getattr(f, attr)
                if value is not None and math.isfinite(value):
                    rows.add(tuple(labels), value)
    yield from (rows for _, rows in families)

    report = analysis.report
    score, flag, signal = Rows.of(SCORE), STRAGGLER.gauge(), SIGNAL.gauge()
    since, peers = SINCE.gauge(), PEER_STATISTICS.gauge()
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
                if sc.outlier:
                    signal.add_metric([*labels, name, sc.direction or ""], 1.0)
    yield from (score, flag, signal, since, peers)
    yield from _stall_families(snapshot, analysis)


def _stall_families(snapshot: Snapshot, analysis) -> Iterator[Metric]:
    stall = analysis.stall
    yield STALL_ACTIVE.gauge(1.0 if stall is not None and stall.stalled else 0.0)
    yield STALLS.counter(analysis.stalls_total)
    yield STALL_SECONDS.counter(analysis.stall_seconds_total)
    culprit, waiting, culprit_seconds = CULPRIT.gauge(), WAITING.gauge(), CULPRIT_SECONDS.counter()
    for gpu in range(snapshot.gpu_count):
        labels = _labels(snapshot, gpu)
        if labels is None:
            continue
        stalled = stall is not None and stall.stalled
        culprit.add_metric(labels, 1.0 if stalled and gpu in stall.culprit_gpus else 0.0)
        waiting.add_metric(labels, 1.0 if stalled and gpu in stall.waiting_gpus else 0.0)
        culprit_seconds.add_metric(labels, analysis.culprit_seconds.get(gpu, 0.0))
    yield from (culprit, waiting, culprit_seconds)
    yield HELD.gauge(1.0 if analysis.held else 0.0)
    yield COVERAGE.by_label(dict(sorted(analysis.coverage.items())))
    yield DURATION.gauge(analysis.duration_seconds)
