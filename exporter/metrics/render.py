"""Render a Snapshot to the Prometheus text format once; scrapes reuse the bytes."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import Metric

from exporter.collectors import registry
from exporter.health.model import NodeHealth
from exporter.health.monitor import Published
from exporter.metrics.exposition import WRITER
from exporter.metrics.goodput import goodput_families
from exporter.metrics.gpu import gpu_families
from exporter.metrics.gpu_hardware import (
    clock_event_families,
    link_memory_families,
    link_memory_key,
    nvlink_traffic_families,
    up_families,
    xid_families,
)
from exporter.metrics.health import verdict_families
from exporter.metrics.power import power_families
from exporter.metrics.selection import Selection
from exporter.metrics.self_metrics import self_families
from exporter.metrics.stragglers import straggler_families
from exporter.sampling.snapshot import Snapshot

if TYPE_CHECKING:  # the compat module is imported only where --metrics.compat asks for it
    from exporter.metrics.compat.dcgm import DcgmCompat

FamilyFunction = Callable[[Snapshot], Iterable[Metric]]

DEFAULT = Selection()  # the default profile, no selection file

# The classic text format, which every Prometheus since 2.0 parses (2.42 is our floor).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def collector_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Each collector's families from its last reading (the registry says how)."""
    specs = {spec.name: spec for spec in registry.specs()}
    for name, result in sorted(snapshot.collectors.items()):
        spec = specs.get(name)
        if spec is not None and result.reading is not None:
            yield from spec.families(result.reading, snapshot)


class CachedFamilies:
    """Families whose rendering is reused while `key(snapshot)` stays the same (those
    whose values seldom change: the key is what they show)."""

    def __init__(self, families: FamilyFunction, key: Callable[[Snapshot], Any]):
        self.families, self.key = families, key
        self.__name__ = families.__name__
        self._last: tuple[Any, bytes] | None = None
        self._lock = threading.Lock()

    def __call__(self, snapshot: Snapshot) -> Iterable[Metric]:
        return self.families(snapshot)

    def render(self, snapshot: Snapshot, selection: Selection = DEFAULT) -> bytes:
        key = (selection, self.key(snapshot))
        with self._lock:
            if self._last is not None and self._last[0] == key:
                return self._last[1]
        body = WRITER.write(selection.apply(self.families(snapshot)))
        with self._lock:
            self._last = (key, body)
        return body


# Each area adds its families here; the order is the order of the output. A rendered
# snapshot adds its verdict's families and the serving side's figures after them
# (RenderedSnapshot.sources): one list, one way to /metrics.
FAMILY_FUNCTIONS: list[FamilyFunction] = [
    gpu_families, up_families, xid_families, clock_event_families,
    CachedFamilies(link_memory_families, link_memory_key),
    nvlink_traffic_families, power_families, straggler_families, goodput_families,
    collector_families, self_families]


def _collect(snapshot: Snapshot, sources: list[FamilyFunction],
             selection: Selection) -> Iterator[Metric]:
    for source in sources:
        yield from selection.apply(source(snapshot))


def render(snapshot: Snapshot, sources: Sequence[FamilyFunction] | None = None,
           selection: Selection = DEFAULT) -> bytes:
    """The exposition of the families `selection` wants from `sources` (default
    FAMILY_FUNCTIONS), in order; cached parts are reused, the rest rendered anew. Each
    family is written whole by one write, so joining the parts is a valid exposition."""
    parts: list[bytes] = []
    plain: list[FamilyFunction] = []
    for source in sources or FAMILY_FUNCTIONS:
        if isinstance(source, CachedFamilies):
            if plain:
                parts.append(WRITER.write(_collect(snapshot, plain, selection)))
                plain = []
            parts.append(source.render(snapshot, selection))
        else:
            plain.append(source)
    if plain:
        parts.append(WRITER.write(_collect(snapshot, plain, selection)))
    return b"".join(parts)


class RenderedSnapshot:
    """A published value (a snapshot and its verdict) and its exposition, rendered once,
    by the first scrape that asks for it, with its gzip: every later scrape of it writes
    the same bytes, so a scrape's cost does not grow with the number of series or
    scrapers, and a snapshot no one scrapes (one a second, against Prometheus' one per
    15-60 s) costs nothing to render."""

    def __init__(self, published: Published,
                 extra: Callable[[], Sequence[Metric]] = lambda: (),
                 selection: Selection = DEFAULT, compat: DcgmCompat | None = None):
        """`extra`: families from outside the snapshot (the server's own figures), taken
        when the snapshot is rendered; `selection`: the families served; `compat`:
        dcgm-exporter's families, written after ours (--metrics.compat)."""
        self.published = published
        self.compat = compat
        self.extra = extra
        self.selection = selection
        self._body: bytes | None = None
        self._gzipped: bytes | None = None
        self._lock = threading.Lock()

    @property
    def snapshot(self) -> Snapshot:
        return self.published.snapshot

    @property
    def verdict(self) -> NodeHealth:
        """The snapshot's verdict (HealthMonitor.assess): always there, `unknown` where
        nothing judged it."""
        return self.published.verdict

    @property
    def body(self) -> bytes:
        if self._body is None:
            with self._lock:
                if self._body is None:
                    body = render(self.snapshot, self.sources(), self.selection)
                    if self.compat is not None:  # another exporter's names, after ours
                        body += self.compat.render(self.snapshot, self.verdict)
                    self._body = body
        return self._body

    def sources(self) -> list[FamilyFunction]:
        """Every family source of this exposition, in the order of the output: the
        snapshot's, its verdict's, then the serving side's own figures."""
        return [*FAMILY_FUNCTIONS, self._verdict_families, self._extra_families]

    def _verdict_families(self, snapshot: Snapshot) -> Iterable[Metric]:
        return verdict_families(self.verdict, snapshot)

    def _extra_families(self, snapshot: Snapshot) -> Iterable[Metric]:
        return self.extra()

    @property
    def gzipped(self) -> bytes:
        if self._gzipped is None:
            body = self.body
            with self._lock:
                if self._gzipped is None:
                    # level 1: 10x smaller for a third of level 6's time on this text
                    self._gzipped = gzip.compress(body, compresslevel=1, mtime=0)
        return self._gzipped
