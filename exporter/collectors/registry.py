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
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from prometheus_client.metrics_core import Metric

from exporter.options import RUN, Option, build, flatten, options_of
from exporter.sampling.collector_api import Collector, CollectorContext
from exporter.sampling.snapshot import Snapshot


@dataclass(frozen=True)
class NoSettings:
    """A collector with no settings of its own."""


S = TypeVar("S")


@dataclass(frozen=True)
class CollectorSpec(Generic[S]):
    """A collector, and its settings: a frozen dataclass of `setting(...)` fields."""

    name: str
    help: str
    # on by default, or a rule on its settings (e.g. jobs: on when a mapping dir is set)
    default: bool | Callable[[S], bool]
    factory: Callable[[S, CollectorContext], Collector]
    # (reading, snapshot); Any: each collector's reading is its own type
    families: Callable[[Any, Snapshot], Iterable[Metric]]
    settings: type[S]
    # seconds between reads, from its settings (None: sources_interval_seconds)
    interval: Callable[[S], float] | None = None
    commands: tuple[str, ...] = (RUN,)
    requirement: Callable[[S], str | None] | None = None  # why it cannot run when forced

    @property
    def key(self) -> str:
        return f"collector_{self.name}"

    @property
    def toggle(self) -> Option:
        shown = self.default if isinstance(self.default, bool) else None
        return Option(self.key, f"--collector.{self.name}", bool, shown, self.help,
                      optional=True, commands=self.commands)

    @property
    def options(self) -> tuple[Option, ...]:
        return options_of(self.settings)

    def settings_in(self, config: CollectorsConfig) -> S:
        chosen = config.settings.get(self.name)
        assert isinstance(chosen, self.settings), (self.name, chosen)
        return chosen

    def enabled(self, config: CollectorsConfig) -> bool:
        chosen = config.enabled.get(self.name)
        if chosen is not None:
            return chosen
        if isinstance(self.default, bool):
            return self.default
        return self.default(self.settings_in(config))

    def interval_in(self, config: CollectorsConfig, otherwise: float) -> float:
        return otherwise if self.interval is None else self.interval(self.settings_in(config))

    def missing(self, config: CollectorsConfig) -> str | None:
        """Why this collector cannot run (when it is turned on), or None."""
        if self.requirement is None:
            return None
        return self.requirement(self.settings_in(config))


@cache
def specs() -> tuple[CollectorSpec[Any], ...]:
    """Every collector package's SPEC (in its spec.py), by name."""
    import exporter.collectors as package

    found = []
    for name in _packages(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{name}.spec")
        spec = getattr(module, "SPEC", None)
        if isinstance(spec, CollectorSpec):
            found.append(spec)
    return tuple(sorted(found, key=lambda s: s.name))


def _packages(folders: Iterable[str]) -> list[str]:
    """The packages in `folders` (directories with an __init__.py), as
    pkgutil.iter_modules finds them, without loading pkgutil at every start."""
    return sorted({entry.name for folder in folders for entry in os.scandir(folder)
                   if entry.is_dir() and os.path.isfile(os.path.join(entry.path, "__init__.py"))})


def options() -> list[Option]:
    """Each collector's on/off toggle and its own options."""
    return [option for spec in specs() for option in (spec.toggle, *spec.options)]


@dataclass(frozen=True)
class CollectorsConfig:
    """Which collectors are on (None: their default rule) and each one's settings."""

    enabled: Mapping[str, bool | None] = field(default_factory=dict)
    settings: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def of(cls, values: Mapping[str, object]) -> CollectorsConfig:
        """From flat config keys (`collector_NAME` and each collector's own)."""
        enabled: dict[str, bool | None] = {}
        settings: dict[str, object] = {}
        for spec in specs():
            toggle = values.get(spec.key)
            assert toggle is None or isinstance(toggle, bool), (spec.key, toggle)
            enabled[spec.name] = toggle
            own = {o.key for o in spec.options}
            settings[spec.name] = build(spec.settings, {k: v for k, v in values.items()
                                                        if k in own})
        return cls(MappingProxyType(enabled), MappingProxyType(settings))

    def values(self) -> dict[str, object]:
        """Flat config keys -> values, as `of` takes them."""
        out: dict[str, object] = {}
        for spec in specs():
            out[spec.key] = self.enabled.get(spec.name)
            out |= flatten(spec.settings_in(self))
        return out


def enabled(config: CollectorsConfig) -> list[CollectorSpec[Any]]:
    return [spec for spec in specs() if spec.enabled(config)]
