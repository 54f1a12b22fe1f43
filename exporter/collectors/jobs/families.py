"""GPU -> job mapping -> a join metric, ``gpu_hpc_job_info{gpu, uuid, hpc_job} 1``.

A MIG instance's file (``GPU.INSTANCE``) gives its jobs a ``gpu_instance`` label, the GPU
instance id (empty for a whole GPU), as ``gpu_pod_info`` and ``gpu_mig_instance_info``
carry it.

The job is not a label on every GPU series: it lives on its own ``_info`` series and
queries join it in (``* on(gpu, uuid, instance) group_left(hpc_job)``), so a ``sum()``
over GPU series never counts a GPU twice, and a shared GPU simply has one info series
per job. The label is ``hpc_job`` (as dcgm-exporter names it), never ``job``, which
Prometheus sets to the scrape job.

A job's Slurm user, account and partition (the prolog's ``.jobs/<id>`` file) are on the
same series as ``hpc_user``, ``hpc_account`` and ``hpc_partition``, empty (so absent in
Prometheus) where not recorded: a dcgm-style file alone gives the series it always did.
They are per job, so they add no series, and chargeback rules group by them directly.

The GPU's uuid comes from the snapshot's identities, so the families take the snapshot
beside the reading.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter.collectors.jobs.reading import (
    DROP_REASONS,
    MAX_JOBS_PER_GPU,
    MAX_JOBS_PER_NODE,
    SKIP_REASONS,
    JobAttributes,
    JobsReading,
)
from exporter.families import MINIMAL, Family
from exporter.sampling.snapshot import Snapshot

__all__ = ["DECLARED", "jobs_families"]

JOB_INFO = Family(
    "gpu_hpc_job_info", "info",
    "Job holding the GPU (one series per job on a shared GPU), or a MIG instance of it "
    "(gpu_instance, empty for the whole GPU), with its Slurm user, account and partition "
    "where the prolog recorded them; value 1. Join it into GPU series on gpu and uuid.",
    ("gpu", "uuid", "hpc_job", "gpu_instance", "hpc_user", "hpc_account", "hpc_partition"),
    source="mapping files in `--hpc-job-mapping-dir`; `.jobs/<job id>` from the Slurm prolog",
    profile=MINIMAL,
    doc="Job holding the GPU (or, with `gpu_instance`, one of its MIG instances; empty for "
        "the whole GPU), one series per job, with its Slurm user, account and partition "
        "where the prolog recorded them (empty otherwise); value 1. Join it into GPU series "
        "on `gpu`, `uuid` (and `instance`).")
SKIPPED_FILES = Family(
    "cte_hpc_job_skipped_files_total", "counter",
    "GPU-to-job mapping files skipped, by reason; counted on every read pass while the file "
    "is there.", ("reason",), source="exporter",
    doc="Mapping files skipped, by reason, on every read pass while they are there.")
IDS_DROPPED = Family(
    "cte_hpc_job_ids_dropped_total", "counter",
    "Job ids left out at a cap (per_gpu: past the per-file cap; per_node: past the per-pass "
    "cap), counted on every read pass while they are there.", ("reason",), source="exporter",
    doc=f"Job ids left out at a cap, by cap (`per_gpu`: past {MAX_JOBS_PER_GPU} in one file; "
        f"`per_node`: past {MAX_JOBS_PER_NODE} in one pass), on every read pass while they "
        "are there.")

DECLARED = (JOB_INFO, SKIPPED_FILES, IDS_DROPPED)


def jobs_families(reading: JobsReading, snapshot: Snapshot) -> Iterator[Metric]:
    uuids = {i.index: i.uuid for i in snapshot.identities if i is not None}
    info = JOB_INFO.info(by=JOB_INFO.labels)
    attributes = getattr(reading, "attributes", {})
    none = JobAttributes()
    rows = [((gpu, -1), jobs) for gpu, jobs in reading.jobs.items()]
    rows += list(getattr(reading, "instance_jobs", {}).items())
    for (gpu, instance), jobs in sorted(rows):
        uuid = uuids.get(gpu)
        if uuid is None:  # a GPU NVML does not show has no series to join to
            continue
        # "" for a whole GPU: Prometheus stores an empty label as no label, so the
        # whole-GPU series (and every join on gpu, uuid) are as before MIG files existed
        label = "" if instance < 0 else str(instance)
        for job in jobs:
            who = attributes.get(job, none)
            info.add_metric([str(gpu), uuid, job, label, who.user, who.account,
                             who.partition], {})
    if info.samples:
        yield info

    yield SKIPPED_FILES.by_label(reading.skipped_total, SKIP_REASONS)
    yield IDS_DROPPED.by_label(reading.dropped_total, DROP_REASONS)
