"""The jobs collector's spec: its flag, settings, factory and families."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.collectors.jobs.attributes import JobAttributesReader
from exporter.collectors.jobs.families import jobs_families
from exporter.collectors.jobs.reading import JobsCollector
from exporter.collectors.registry import CollectorSpec
from exporter.options import setting
from exporter.sampling.collector_api import CollectorContext


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
    assert settings.mapping_dir is not None  # the requirement
    return JobsCollector(settings.mapping_dir, context.gpu_count,
                         JobAttributesReader(settings.mapping_dir))


SPEC = CollectorSpec(
    name="jobs",
    help="which job holds which GPU, from dcgm-exporter-style mapping files "
    "(default: on when --hpc-job-mapping-dir is set)",
    default=lambda settings: settings.mapping_dir is not None,
    factory=_make,
    families=jobs_families,
    settings=JobsSettings,
    requirement=lambda settings: None if settings.mapping_dir else (
        "needs --hpc-job-mapping-dir"),
)
