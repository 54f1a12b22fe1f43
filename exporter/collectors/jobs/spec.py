"""The jobs collector's spec: its flag, settings, factory and families.

The collector's modules are imported when it is made or its reading rendered: a node
without a mapping directory never loads them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric

from exporter.collectors.registry import CollectorSpec
from exporter.options import setting
from exporter.sampling.collector_api import CollectorContext
from exporter.sampling.snapshot import Snapshot

if TYPE_CHECKING:
    from exporter.collectors.jobs.reading import JobsCollector, JobsReading


def _mapping_dir_problem(text: str) -> str | None:
    return None if text.strip() else ("expected a directory path (leave unset to turn the "
                                      "jobs collector off)")


@dataclass(frozen=True)
class JobsSettings:
    mapping_dir: str | None = setting(
        None, "directory of GPU-to-job files as dcgm-exporter reads them (one file per GPU "
        "index, or GPU.INSTANCE for a MIG instance, one job id per line); unset: off",
        key="hpc_job_mapping_dir", flag="--hpc-job-mapping-dir", metavar="DIR",
        optional=True, check=_mapping_dir_problem)


def _make(settings: JobsSettings, context: CollectorContext) -> JobsCollector:
    from exporter.collectors.jobs.attributes import JobAttributesReader
    from exporter.collectors.jobs.reading import JobsCollector

    assert settings.mapping_dir is not None  # the requirement
    return JobsCollector(settings.mapping_dir, context.gpu_count,
                         JobAttributesReader(settings.mapping_dir))



def _families(reading: JobsReading, snapshot: Snapshot) -> Iterator[Metric]:
    from exporter.collectors.jobs.families import jobs_families

    return jobs_families(reading, snapshot)


SPEC = CollectorSpec(
    name="jobs",
    help="which job holds which GPU, from dcgm-exporter-style mapping files "
    "(default: on when --hpc-job-mapping-dir is set)",
    default=lambda settings: settings.mapping_dir is not None,
    factory=_make,
    families=_families,
    settings=JobsSettings,
    requirement=lambda settings: None if settings.mapping_dir else (
        "needs --hpc-job-mapping-dir"),
)
