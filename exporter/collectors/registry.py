"""The collector registry: one spec per collector, from which everything else follows.

A collector is a package in this one (`collectors/NAME/`: `reading.py` reads,
`families.py` turns a reading into metric families, `spec.py` holds its `SPEC`). From
the specs come the `--[no-]collector.NAME` flags and `collector_NAME` config keys, each
collector's own options (flags and keys), `check-config`'s summary, the flags table in
the docs and the render list. Adding a collector is adding one package (plus its test
and doc lines), as node_exporter's `registerCollector` does.

At run time each enabled collector reads on its own thread at its own interval (a stuck
read stalls only that collector); its last reading goes into the snapshot, and its
`families(reading, snapshot)` turn it into metric families.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.options import RUN, Option
from exporter.sampling.collector_api import Collector, CollectorContext


@dataclass(frozen=True)
class CollectorSpec:
    name: str
    help: str
    # on by default, or a rule on the config (e.g. jobs: on when a mapping dir is set)
    default: bool | Callable[[Any], bool]
    factory: Callable[[Any, CollectorContext], Collector]
    families: Callable[[Any, Any], Iterable[Metric]]  # (reading, snapshot)
    options: tuple[Option, ...] = ()
    # seconds between reads, from the config (default: sources_interval_seconds)
    interval: Callable[[Any], float] = field(default=lambda c: c.sources_interval_seconds)
    commands: tuple[str, ...] = (RUN,)
    requirement: Callable[[Any], str | None] | None = None  # why it cannot run when forced

    @property
    def key(self) -> str:
        return f"collector_{self.name}"

    @property
    def toggle(self) -> Option:
        shown = self.default if isinstance(self.default, bool) else None
        return Option(self.key, f"--collector.{self.name}", bool, shown, self.help,
                      optional=True, commands=self.commands)

    def enabled(self, config: Any) -> bool:
        chosen = getattr(config, self.key)
        if chosen is not None:
            return chosen
        return self.default if isinstance(self.default, bool) else self.default(config)


@cache
def specs() -> tuple[CollectorSpec, ...]:
    """Every collector package's SPEC (in its spec.py), by name."""
    import exporter.collectors as package

    found = []
    for info in pkgutil.iter_modules(package.__path__):
        if not info.ispkg:
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}.spec")
        spec = getattr(module, "SPEC", None)
        if isinstance(spec, CollectorSpec):
            found.append(spec)
    return tuple(sorted(found, key=lambda s: s.name))


def options() -> list[Option]:
    """Each collector's on/off toggle and its own options."""
    return [option for spec in specs() for option in (spec.toggle, *spec.options)]


def enabled(config: Any) -> list[CollectorSpec]:
    return [spec for spec in specs() if spec.enabled(config)]


def counts_by(name: str, documentation: str, label: str, known: Iterable[str],
              totals: Mapping[str, float]) -> CounterMetricFamily:
    """A counter of a collector's errors or skips by `label`: every `known` value from
    the start (0 until it happens, so `rate()` sees the first one), then any other."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value in dict.fromkeys((*known, *totals)):
        family.add_metric([value], float(totals.get(value, 0)))
    return family
