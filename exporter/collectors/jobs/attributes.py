"""A job's user, account and partition, from ``<mapping dir>/.jobs/<job id>``.

The Slurm prolog (deploy/slurm/prolog.sh) writes one small file per job, from
``SLURM_JOB_USER``, ``SLURM_JOB_ACCOUNT`` and ``SLURM_JOB_PARTITION``::

    user=alice
    account=physics
    partition=gpu

and the epilog removes it. The GPU files keep dcgm-exporter's format (one job id a line),
and the directory is hidden, so other readers of the mapping directory see nothing new.

Only the jobs a pass already kept are looked up (at most 256), each file read with the
same bounds as a GPU file (no links followed, 4 KiB at most) and again only when its
``(mtime_ns, size, inode)`` changed. A file that is unusable (a link, binary, a value
with characters Slurm does not use in these names) is skipped and counted by reason with
the GPU files; a job without a file has empty attributes.
"""

from __future__ import annotations

import os
import re

from exporter.collectors.jobs.reading import BadFile, JobAttributes, ascii_text, read_cached

__all__ = ["ATTRIBUTES_DIR", "JobAttributesReader", "parse_attributes"]

ATTRIBUTES_DIR = ".jobs"
_VALUE_RE = re.compile(r"[A-Za-z0-9_.@+-]{1,128}\Z")
_KEYS = ("user", "account", "partition")
_Key = tuple[int, int, int]


def parse_attributes(raw: bytes) -> JobAttributes:
    """A ``.jobs/<id>`` file's bytes -> its attributes (unknown keys are ignored)."""
    text = ascii_text(raw)
    found: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise BadFile("garbage")
        if key in _KEYS:
            if _VALUE_RE.match(value) is None:
                raise BadFile("garbage")
            found[key] = value
    return JobAttributes(**found)


class JobAttributesReader:
    """Reads ``.jobs/<id>`` under the mapping directory, cached while unchanged."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = os.path.join(os.fspath(directory), ATTRIBUTES_DIR)
        self._cache: dict[str, tuple[_Key, JobAttributes | str]] = {}

    def __call__(self, jobs: list[str], skipped: dict[str, int]) -> dict[str, JobAttributes]:
        out: dict[str, JobAttributes] = {}
        seen: dict[str, tuple[_Key, JobAttributes | str]] = {}
        for job in jobs:
            result = self._one(job, seen)
            if isinstance(result, str):
                skipped[result] = skipped.get(result, 0) + 1
            elif result is not None:
                out[job] = result
        self._cache = seen
        return out

    def _one(self, job: str, seen: dict[str, tuple[_Key, JobAttributes | str]]
             ) -> JobAttributes | str | None:
        if job.startswith(".") or "/" in job:  # never a path outside the directory
            return None
        return read_cached(os.path.join(self.directory, job), job, self._cache, seen,
                           parse_attributes, None)  # no file: a dcgm-style file alone
