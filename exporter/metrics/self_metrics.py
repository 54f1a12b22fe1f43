"""The exporter's own health: build, loops, collectors, NVML errors, hung and lost GPUs."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from exporter import __version__
from exporter.sampling.snapshot import Snapshot

# the families a loop's figures go into, one sample per loop
LabelledFamily = TypeVar("LabelledFamily", GaugeMetricFamily, CounterMetricFamily)

# Loops whose staleness and rate are exported (every loop's CPU is)
SAMPLING_LOOPS = ("power", "sweep")


def self_families(snapshot: Snapshot) -> Iterator[Metric]:
    yield from _identity_families(snapshot)
    yield from _loop_families(snapshot)
    yield GaugeMetricFamily("cte_snapshot_time_seconds",
                            "When the snapshot being served was built (epoch); "
                            "time() minus this is its age as the scraper sees it.",
                            value=snapshot.time)
    errors = CounterMetricFamily("cte_nvml_errors",
                                 "NVML calls that failed, by call and error name (a value "
                                 "that is NotSupported is counted here once and left out).",
                                 labels=["call", "error"])
    for (call, error), count in sorted(snapshot.nvml_errors.items()):
        errors.add_metric([call, error], count)
    yield errors
    yield from _collector_families(snapshot)
    yield from _gpu_supervision_families(snapshot)
    yield GaugeMetricFamily("cte_xid_event_gpus", "GPUs registered for XID events.",
                            value=snapshot.xid_events_registered)
    yield GaugeMetricFamily("cte_power_buffer_bytes",
                            "Memory held by the power ring buffers.",
                            value=snapshot.power_buffer_bytes)


def _identity_families(snapshot: Snapshot) -> Iterator[Metric]:
    build = InfoMetricFamily("cte_build", "Exporter build; value 1.")
    build.add_metric([], {"version": __version__, "python_version": platform.python_version(),
                          "nvml_bindings_version": snapshot.bindings_version})
    yield build
    backend = InfoMetricFamily("cte_backend", "Where GPU data comes from (nvml, fake, or "
                               "replay of a trace); value 1.")
    backend.add_metric([], {"backend": snapshot.backend, "scenario": snapshot.scenario})
    yield backend
    yield GaugeMetricFamily("cte_start_time_seconds", "When the exporter started (epoch).",
                            value=snapshot.started_at)
    yield GaugeMetricFamily("cte_gpus", "GPUs NVML reported at start.",
                            value=snapshot.gpu_count)


def _loop_families(snapshot: Snapshot) -> Iterator[Metric]:
    def family(cls: type[LabelledFamily], name: str, doc: str) -> LabelledFamily:
        return cls(name, doc, labels=["loop"])

    target = family(GaugeMetricFamily, "cte_loop_target_hertz",
                    "Configured rate of a sampling loop.")
    achieved = family(GaugeMetricFamily, "cte_loop_achieved_hertz",
                      "Achieved rate of a sampling loop over its last ~10 s.")
    iterations = family(CounterMetricFamily, "cte_loop_iterations", "Completed loop iterations.")
    overruns = family(CounterMetricFamily, "cte_loop_overruns",
                      "Ticks skipped because an iteration ran too long.")
    jitter = family(GaugeMetricFamily, "cte_loop_jitter_p99_seconds",
                    "99th percentile lateness of tick starts.")
    age = family(GaugeMetricFamily, "cte_loop_last_completed_age_seconds",
                 "Seconds since the loop last completed an iteration; grows while sampling "
                 "is stuck (e.g. a hung NVML call).")
    duration = family(GaugeMetricFamily, "cte_loop_duration_seconds",
                      "How long the loop's last iteration took.")
    restarts = family(CounterMetricFamily, "cte_loop_restarts",
                      "Times a loop stuck in one GPU's call was replaced by a fresh thread.")
    for name in SAMPLING_LOOPS:
        stats = snapshot.loops.get(name)
        if stats is None:
            continue
        target.add_metric([name], stats.target_hertz)
        achieved.add_metric([name], stats.achieved_hertz)
        iterations.add_metric([name], stats.iterations_total)
        overruns.add_metric([name], stats.overruns_total)
        jitter.add_metric([name], stats.jitter_p99_seconds)
        if stats.last_completed:
            age.add_metric([name], max(0.0, snapshot.time - stats.last_completed))
        duration.add_metric([name], stats.last_duration_seconds)
        restarts.add_metric([name], stats.restarts_total)
    cpu = family(CounterMetricFamily, "cte_loop_cpu_seconds", "CPU time spent in a loop's "
                 "ticks (power, sweep, analyses, each collector, publish).")
    for name, stats in sorted(snapshot.loops.items()):
        cpu.add_metric([name], stats.cpu_seconds_total)
    yield from (target, achieved, iterations, overruns, jitter, age, duration, restarts, cpu)


def _collector_families(snapshot: Snapshot) -> Iterator[Metric]:
    duration = GaugeMetricFamily("cte_source_duration_seconds",
                                 "How long the last read of a collector took.",
                                 labels=["source"])
    success = GaugeMetricFamily("cte_source_success", "1 if the last read of a collector "
                                "succeeded (0 while a read is stuck).", labels=["source"])
    errors = CounterMetricFamily("cte_source_errors", "Failed reads of a collector.",
                                 labels=["source"])
    stuck = GaugeMetricFamily("cte_source_stuck_seconds", "How long a collector's read has "
                              "not returned (only while it is stuck).", labels=["source"])
    for name, result in sorted(snapshot.collectors.items()):
        duration.add_metric([name], result.duration_seconds)
        success.add_metric([name], 1.0 if result.success else 0.0)
        errors.add_metric([name], result.errors_total)
        if result.stuck_seconds:
            stuck.add_metric([name], result.stuck_seconds)
    yield from (duration, success, errors, stuck)


def _gpu_supervision_families(snapshot: Snapshot) -> Iterator[Metric]:
    attempts = CounterMetricFamily("cte_gpu_recovery_attempts",
                                   "Tries to get a lost GPU back (fresh handle, same UUID).",
                                   labels=["gpu"])
    recoveries = CounterMetricFamily("cte_gpu_recoveries", "Lost GPUs that answered again.",
                                     labels=["gpu"])
    hangs = CounterMetricFamily("cte_gpu_hangs", "Times an NVML call on the GPU hung past the "
                                "hang timeout.", labels=["gpu"])
    stuck = GaugeMetricFamily("cte_gpu_stuck_seconds", "How long the GPU's hung NVML call "
                              "has been running (only while it hangs).", labels=["gpu"])
    for gpu, count in sorted(snapshot.recovery_attempts.items()):
        attempts.add_metric([str(gpu)], count)
    for gpu, count in sorted(snapshot.recoveries.items()):
        recoveries.add_metric([str(gpu)], count)
    for gpu, count in sorted(snapshot.hangs.items()):
        hangs.add_metric([str(gpu)], count)
    for gpu, since in sorted(snapshot.hung.items()):
        stuck.add_metric([str(gpu)], max(0.0, snapshot.time - since))
    yield from (attempts, recoveries, hangs, stuck)
