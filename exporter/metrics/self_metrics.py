"""The exporter's own state: build, loops, collectors, NVML errors, hung and lost GPUs."""

from __future__ import annotations

import platform
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter import __version__
from exporter.families import FULL, MINIMAL, Family
from exporter.sampling.snapshot import Snapshot

# Loops whose staleness and rate are exported (every loop's CPU is)
SAMPLING_LOOPS = ("power", "sweep")

BUILD = Family(
    "cte_build_info", "info", "Exporter build; value 1.",
    ("version", "python_version", "nvml_bindings_version"), source="package",
    profile=MINIMAL)
BACKEND = Family(
    "cte_backend_info", "info",
    "Where GPU data comes from (nvml, fake, or replay of a trace); value 1.",
    ("backend", "scenario"), source="config",
    doc="`backend` is `nvml`, `fake` or `replay`; `scenario` names the fake's scenario or "
        "the replayed trace.")
START_TIME = Family(
    "cte_start_time_seconds", "gauge", "When the exporter started (epoch).", unit="s",
    source="exporter", doc="When the exporter started (Unix time).")
GPUS = Family("cte_gpus", "gauge", "GPUs NVML reported at start.",
              source="`nvmlDeviceGetCount`", profile=MINIMAL)
LOOP_TARGET = Family(
    "cte_loop_target_hertz", "gauge", "Configured rate of a sampling loop.", ("loop",),
    unit="Hz", source="config",
    doc="Configured rate of the `power` loop (the drain interval's, or the polling rate "
        "where a GPU is polled) and the `sweep` loop.")
LOOP_ACHIEVED = Family(
    "cte_loop_achieved_hertz", "gauge",
    "Achieved rate of a sampling loop over its last ~10 s.", ("loop",), unit="Hz",
    source="sampler", profile=FULL, doc="Achieved rate over the loop's last ~10 s.")
LOOP_ITERATIONS = Family(
    "cte_loop_iterations_total", "counter", "Completed loop iterations.", ("loop",),
    source="sampler", profile=FULL, doc="Completed iterations.")
LOOP_OVERRUNS = Family(
    "cte_loop_overruns_total", "counter", "Ticks skipped because an iteration ran too long.",
    ("loop",), source="sampler",
    doc="Ticks skipped because an iteration ran past the next tick.")
LOOP_JITTER = Family(
    "cte_loop_jitter_p99_seconds", "gauge", "99th percentile lateness of tick starts.",
    ("loop",), unit="s", source="sampler", profile=FULL,
    doc="99th percentile of how late ticks started against their schedule.")
LOOP_AGE = Family(
    "cte_loop_last_completed_age_seconds", "gauge",
    "Seconds since the loop last completed an iteration; grows while sampling is stuck "
    "(e.g. a hung NVML call).", ("loop",), unit="s", source="sampler", profile=MINIMAL,
    doc="Seconds since the loop last completed, at snapshot time; grows while a call "
        "hangs.")
LOOP_DURATION = Family(
    "cte_loop_duration_seconds", "gauge", "How long the loop's last iteration took.",
    ("loop",), unit="s", source="sampler", profile=FULL,
    doc="Duration of the loop's last iteration (all GPUs).")
LOOP_CPU = Family(
    "cte_loop_cpu_seconds_total", "counter",
    "CPU time spent in a loop's ticks (power, sweep, analyses, each collector, publish).",
    ("loop",), unit="s", source="sampler",
    doc="CPU time spent in each loop's ticks (`power`, `sweep`, `analysis`, `stragglers`, "
        "each collector by name, `publish`, and `power_watch`, which leaves a reader "
        "stuck in one GPU's call behind; `power`, `sweep`, `analysis`, `stragglers` and "
        "`publish` share one thread, `power_watch` and each collector have their own): "
        "where the exporter's own cost goes (NVML's included).")
SNAPSHOT_TIME = Family(
    "cte_snapshot_time_seconds", "gauge",
    "When the snapshot being served was built (epoch); time() minus this is its age as "
    "the scraper sees it.", unit="s", source="publisher",
    doc="When the served snapshot was built; `time() - cte_snapshot_time_seconds` is its "
        "age.")
NVML_ERRORS = Family(
    "cte_nvml_errors_total", "counter",
    "NVML calls that failed, by call and error name (a value that is NotSupported is "
    "counted here once and left out).", ("call", "error"), source="backend",
    profile=MINIMAL,
    doc="Failed NVML calls by call (e.g. `nvmlDeviceGetFieldValues(POWER_INSTANT)`) and "
        "error name (`NotSupported`, `GpuIsLost`, `Timeout`, ...).")
SOURCE_DURATION = Family(
    "cte_source_duration_seconds", "gauge", "How long the last read of a collector took.",
    ("source",), unit="s", source="sampler",
    doc="How long the last read of a collector (`infiniband`, `host`, `jobs`, ...) took.")
SOURCE_SUCCESS = Family(
    "cte_source_success", "gauge",
    "1 if the last read of a collector succeeded (0 while a read is stuck).", ("source",),
    source="sampler",
    doc="1 if that read succeeded; 0 after a failed read or while a read is stuck.")
SOURCE_ERRORS = Family(
    "cte_source_errors_total", "counter", "Failed reads of a collector.", ("source",),
    source="sampler")
SOURCE_STUCK = Family(
    "cte_source_stuck_seconds", "gauge",
    "How long a collector's read has not returned (only while it is stuck).", ("source",),
    unit="s", source="sampler",
    doc="How long a collector's read has not returned (present only while it is stuck: "
        "longer than twice its interval); the other collectors and the GPU loops go on.")
RECOVERY_ATTEMPTS = Family(
    "cte_gpu_recovery_attempts_total", "counter",
    "Tries to get a lost GPU back (fresh handle, same UUID).", ("gpu",), source="sampler",
    doc="Tries to get a lost GPU back (fresh handle, same UUID), every 10 s while it is "
        "lost.")
RECOVERIES = Family(
    "cte_gpu_recoveries_total", "counter", "Lost GPUs that answered again.", ("gpu",),
    source="sampler")
HANGS = Family(
    "cte_gpu_hangs_total", "counter",
    "Times an NVML call on the GPU hung past the hang timeout.", ("gpu",), source="sampler",
    doc="NVML calls on the GPU that hung past the hang timeout (2 s).")
GPU_STUCK = Family(
    "cte_gpu_stuck_seconds", "gauge",
    "How long the GPU's hung NVML call has been running (only while it hangs).", ("gpu",),
    unit="s", source="sampler",
    doc="How long the GPU's hung call has been running; present only while it hangs.")
LOOP_RESTARTS = Family(
    "cte_loop_restarts_total", "counter",
    "Times a loop stuck in one GPU's call was replaced by a fresh thread.", ("loop",),
    source="sampler",
    doc="Times a loop stuck in one GPU's call was replaced by a fresh thread that skips "
        "that GPU.")
XID_EVENT_GPUS = Family(
    "cte_xid_event_gpus", "gauge", "GPUs registered for XID events.",
    source="`nvmlDeviceRegisterEvents`",
    doc="GPUs registered for XID events (fewer than `cte_gpus` means some XIDs cannot be "
        "seen).")
_READ = " (present only when the kernel log is read: by default on NVML, not on the fake)"
XID_DUPLICATES = Family(
    "cte_history_xid_duplicates_total", "counter",
    "XIDs seen both by NVML's events and in the kernel log, counted once.",
    source="`nvmlEventSetWait`, `/dev/kmsg`",
    doc="XIDs seen both by NVML's events and in the kernel log within 30 s, counted once."
        + _READ)
KMSG_XIDS = Family(
    "cte_kmsg_xids_total", "counter", "XID lines read from the kernel log.",
    source="`/dev/kmsg`",
    doc="XID lines the driver wrote to the kernel log, read since start." + _READ)
KMSG_SKIPPED = Family(
    "cte_kmsg_skipped_records_total", "counter",
    "Kernel-log records skipped whole: longer than a record can be, or numbered past 64 "
    "bits.", source="`/dev/kmsg`",
    doc="Kernel-log records skipped whole since start (a log line says why): longer "
        "than 8,192 bytes (no tail of one is read as a record of its own), or with a "
        "sequence or stamp past 64 bits (no cursor can be kept there)." + _READ)
KMSG_READABLE = Family(
    "cte_kmsg_readable", "gauge",
    "1 if the kernel log (/dev/kmsg) can be read for XIDs, 0 if not (no CAP_SYSLOG under "
    "kernel.dmesg_restrict).", source="`/dev/kmsg`",
    doc="1 if the kernel log can be read for XIDs; 0 if not (no `CAP_SYSLOG` under "
        "`kernel.dmesg_restrict=1`: `/readyz` says degraded)." + _READ)
POWER_BUFFER = Family(
    "cte_power_buffer_bytes", "gauge", "Memory held by the power ring buffers.",
    unit="bytes", source="sampler",
    doc="Memory the power ring buffers are sized for (set at start; it grows once, by "
        "the times' float64 form, if a GPU's sample times are not whole microseconds). "
        "Resident as samples fill the ring.")

DECLARED = (BUILD, BACKEND, START_TIME, GPUS, LOOP_TARGET, LOOP_ACHIEVED, LOOP_ITERATIONS,
            LOOP_OVERRUNS, LOOP_JITTER, LOOP_AGE, LOOP_DURATION, LOOP_CPU, SNAPSHOT_TIME,
            NVML_ERRORS, SOURCE_DURATION, SOURCE_SUCCESS, SOURCE_ERRORS, SOURCE_STUCK,
            RECOVERY_ATTEMPTS, RECOVERIES, HANGS, GPU_STUCK, LOOP_RESTARTS, XID_EVENT_GPUS,
            XID_DUPLICATES, KMSG_XIDS, KMSG_SKIPPED, KMSG_READABLE, POWER_BUFFER)


def self_families(snapshot: Snapshot) -> Iterator[Metric]:
    yield from _identity_families(snapshot)
    yield from _loop_families(snapshot)
    yield SNAPSHOT_TIME.gauge(snapshot.time)
    errors = NVML_ERRORS.counter()
    for (call, error), count in sorted(snapshot.nvml_errors.items()):
        errors.add_metric([call, error], count)
    yield errors
    yield from _collector_families(snapshot)
    yield from _gpu_supervision_families(snapshot)
    yield XID_EVENT_GPUS.gauge(snapshot.xid_events_registered)
    sources = snapshot.xid_sources
    if sources is not None and sources.kmsg_read:
        yield XID_DUPLICATES.counter(sources.duplicates)
        yield KMSG_XIDS.counter(sources.kmsg_xids)
        yield KMSG_SKIPPED.counter(sources.kmsg_skipped)
        yield KMSG_READABLE.gauge(0.0 if sources.kmsg_readable is False else 1.0)
    yield POWER_BUFFER.gauge(snapshot.power_buffer_bytes)


def _identity_families(snapshot: Snapshot) -> Iterator[Metric]:
    yield BUILD.info({"version": __version__, "python_version": platform.python_version(),
                      "nvml_bindings_version": snapshot.bindings_version})
    yield BACKEND.info({"backend": snapshot.backend, "scenario": snapshot.scenario})
    yield START_TIME.gauge(snapshot.started_at)
    yield GPUS.gauge(snapshot.gpu_count)


def _loop_families(snapshot: Snapshot) -> Iterator[Metric]:
    target, achieved, jitter, age, duration = (
        LOOP_TARGET.gauge(), LOOP_ACHIEVED.gauge(), LOOP_JITTER.gauge(), LOOP_AGE.gauge(),
        LOOP_DURATION.gauge())
    iterations, overruns, restarts = (
        LOOP_ITERATIONS.counter(), LOOP_OVERRUNS.counter(), LOOP_RESTARTS.counter())
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
    yield from (target, achieved, iterations, overruns, jitter, age, duration, restarts)
    yield LOOP_CPU.by_label({name: stats.cpu_seconds_total
                             for name, stats in sorted(snapshot.loops.items())})


def _collector_families(snapshot: Snapshot) -> Iterator[Metric]:
    duration, success, errors, stuck = (SOURCE_DURATION.gauge(), SOURCE_SUCCESS.gauge(),
                                        SOURCE_ERRORS.counter(), SOURCE_STUCK.gauge())
    for name, result in sorted(snapshot.collectors.items()):
        duration.add_metric([name], result.duration_seconds)
        success.add_metric([name], 1.0 if result.success else 0.0)
        errors.add_metric([name], result.errors_total)
        if result.stuck_seconds:
            stuck.add_metric([name], result.stuck_seconds)
    yield from (duration, success, errors, stuck)


def _gpu_supervision_families(snapshot: Snapshot) -> Iterator[Metric]:
    yield RECOVERY_ATTEMPTS.by_label(dict(sorted(snapshot.recovery_attempts.items())))
    yield RECOVERIES.by_label(dict(sorted(snapshot.recoveries.items())))
    yield HANGS.by_label(dict(sorted(snapshot.hangs.items())))
    yield GPU_STUCK.by_label({gpu: max(0.0, snapshot.time - since)
                              for gpu, since in sorted(snapshot.hung.items())})
