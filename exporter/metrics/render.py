"""Render a Snapshot to the Prometheus text format once; scrapes reuse the bytes."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric

from exporter.metrics.gpu import gpu_families
from exporter.metrics.health import health_families
from exporter.metrics.host import host_families
from exporter.metrics.infiniband import infiniband_families
from exporter.metrics.jobs import jobs_families
from exporter.metrics.power import power_families
from exporter.metrics.self_metrics import self_families
from exporter.metrics.stragglers import straggler_families
from exporter.sampler import Snapshot

FamilySource = Callable[[Snapshot], Iterable[Metric]]

# The classic text format, which every Prometheus since 2.0 parses (2.42 is our floor).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Families of each non-NVML source's reading, by source name. A source whose families
# need more of the snapshot than its own reading (jobs: the GPUs' uuids) is a
# FamilySource in FAMILY_SOURCES instead.
READING_FAMILIES: dict[str, Callable[[Any], Iterable[Metric]]] = {
    "host": host_families,
    "infiniband": infiniband_families,
}


def source_families(snapshot: Snapshot) -> Iterator[Metric]:
    for name, result in sorted(snapshot.sources.items()):
        families = READING_FAMILIES.get(name)
        if families is not None and result.reading is not None:
            yield from families(result.reading)


# Each area adds its families here; the order is the order of the output.
FAMILY_SOURCES: list[FamilySource] = [gpu_families, health_families, power_families,
                                       straggler_families, jobs_families, source_families,
                                       self_families]


class _Families:
    """The tiny registry interface generate_latest() needs."""

    def __init__(self, snapshot: Snapshot, sources: list[FamilySource]):
        self.snapshot, self.sources = snapshot, sources

    def collect(self) -> Iterator[Metric]:
        for source in self.sources:
            yield from source(self.snapshot)


def render(snapshot: Snapshot, sources: list[FamilySource] | None = None) -> bytes:
    return generate_latest(_Families(snapshot, sources or FAMILY_SOURCES))


class RenderedSnapshot:
    """A snapshot's exposition bytes, with its gzip made once, on first demand."""

    def __init__(self, snapshot: Snapshot, body: bytes):
        self.snapshot = snapshot
        self.body = body
        self._gzip: bytes | None = None
        self._lock = threading.Lock()

    @property
    def gzipped(self) -> bytes:
        if self._gzip is None:
            with self._lock:
                if self._gzip is None:
                    self._gzip = gzip.compress(self.body, compresslevel=5, mtime=0)
        return self._gzip
