"""The jobs collector's spec: its flag, options, factory and families."""

from __future__ import annotations

from exporter.collectors.jobs.families import jobs_families
from exporter.collectors.jobs.reading import JobsSource
from exporter.collectors.registry import CollectorSpec
from exporter.options import Option


def _mapping_dir_problem(text: str) -> str | None:
    return None if text.strip() else ("expected a directory path (leave unset to turn the "
                                      "jobs collector off)")


SPEC = CollectorSpec(
    name="jobs",
    help="which job holds which GPU, from dcgm-exporter-style mapping files "
    "(default: on when --hpc-job-mapping-dir is set)",
    default=lambda config: config.hpc_job_mapping_dir is not None,
    factory=lambda config, context: JobsSource(config.hpc_job_mapping_dir, context.gpu_count),
    families=jobs_families,
    options=(Option("hpc_job_mapping_dir", "--hpc-job-mapping-dir", str, None,
                    "directory of GPU-to-job files as dcgm-exporter reads them (one file per "
                    "GPU index, or GPU.INSTANCE for a MIG instance, one job id per line); "
                    "unset: off", metavar="DIR",
                    optional=True, check=_mapping_dir_problem),),
    requirement=lambda config: None if config.hpc_job_mapping_dir else (
        "needs --hpc-job-mapping-dir"),
)
