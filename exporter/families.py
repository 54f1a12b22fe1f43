"""A metric family declared once: name, type, help, labels, unit, source, profile.

Each module that produces families declares them as module-level `Family` constants
beside the code that fills them, and lists them in a module-level tuple `DECLARED`, in
the order docs/metrics.md shows them. Code builds the prometheus_client family from the
declaration (`FAMILY.gauge()`, `.counter()`, `.info()`, `.by_label()`; `Rows.of(FAMILY)` in
exporter.metrics.exposition), so it cannot serve another help or label list.
scripts/build_metrics_docs.py writes the profile and label table
(exporter/metrics/family_table.py) and the tables of docs/metrics.md from the
declarations; tests/test_family_declarations.py holds what is served to them.

This module is in the bottom layer: collectors, metrics, web and history all declare.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

# Profiles, smallest first: each includes every smaller one (docs/metrics.md, "Profiles")
MINIMAL, STANDARD, FULL = "minimal", "standard", "full"
PROFILES = (MINIMAL, STANDARD, FULL)
DEFAULT_PROFILE = STANDARD

TYPES = ("gauge", "counter", "info")  # what the exporter serves
_SUFFIXES = {"counter": "_total", "info": "_info"}
_NAME = re.compile(r"[a-z_][a-z0-9_]*")


@dataclass(frozen=True)
class Family:
    """One metric family. `name` is the exposed one (counters end in `_total`, info in
    `_info`); `labels` as the `full` profile serves them; `unit` and `source` are the
    docs' columns (markdown; unit "-" when none); `doc` the docs' description where it
    says more than `help` (the HELP text exactly as served)."""

    name: str
    type: str
    help: str
    labels: tuple[str, ...] = ()
    unit: str = "-"
    source: str = ""
    profile: str = DEFAULT_PROFILE
    doc: str = ""
    # the docs' label column after the label names, for labels named at run time
    more_labels: str = ""

    def __post_init__(self) -> None:
        problems = []
        if not _NAME.fullmatch(self.name):
            problems.append("a name is lower-case letters, digits and _")
        if self.type not in TYPES:
            problems.append(f"type {self.type!r} is none of {', '.join(TYPES)}")
        suffix = _SUFFIXES.get(self.type)
        if suffix and not self.name.endswith(suffix):
            problems.append(f"a {self.type}'s name ends in {suffix}")
        if self.type == "gauge" and self.name.endswith(("_total", "_info")):
            problems.append("a gauge's name ends in neither _total nor _info")
        if self.profile not in PROFILES:
            problems.append(f"profile {self.profile!r} is none of {', '.join(PROFILES)}")
        if not isinstance(self.labels, tuple):
            problems.append("labels are a tuple")
        elif len(set(self.labels)) != len(self.labels):
            problems.append(f"labels {self.labels} repeat one")
        elif not all(_NAME.fullmatch(label) for label in self.labels):
            problems.append(f"labels {self.labels}: lower-case letters, digits and _")
        if not self.help.strip() or not self.source.strip() or not self.unit.strip():
            problems.append("help, source and unit are given (unit '-' when none)")
        if problems:
            raise ValueError(f"family {self.name}: " + "; ".join(problems))
        if not self.doc:
            object.__setattr__(self, "doc", self.help)

    @property
    def base(self) -> str:
        """The name prometheus_client takes (without `_total` or `_info`)."""
        suffix = _SUFFIXES.get(self.type, "")
        return self.name[:-len(suffix)] if suffix else self.name

    def _expect(self, kind: str) -> None:
        if self.type != kind:
            raise TypeError(f"{self.name} is declared a {self.type}, not a {kind}")

    def gauge(self, value: float | None = None) -> GaugeMetricFamily:
        """The gauge family; `value` for one without labels, else `add_metric` per
        series with the declared labels' values, in their order."""
        self._expect("gauge")
        return GaugeMetricFamily(self.name, self.help, value=value,
                                 labels=list(self.labels) if self.labels else None)

    def counter(self, value: float | None = None) -> CounterMetricFamily:
        """The counter family, as gauge()."""
        self._expect("counter")
        return CounterMetricFamily(self.base, self.help, value=value,
                                   labels=list(self.labels) if self.labels else None)

    def by_label(self, values: Mapping[Any, float],
                 known: Iterable[str] = ()) -> CounterMetricFamily | GaugeMetricFamily:
        """The family of one label with a series per value: every `known` value first (0
        until it happens, so `rate()` sees the first one), then the others in `values`'
        order (its keys as text)."""
        if len(self.labels) != 1:
            raise ValueError(f"{self.name}: by_label needs one label, not {self.labels}")
        family = self.counter() if self.type == "counter" else self.gauge()
        by_text = {str(k): float(v) for k, v in values.items()}
        for value in dict.fromkeys((*known, *by_text)):
            family.add_metric([value], by_text.get(value, 0.0))
        return family

    def without(self, *labels: str) -> Family:
        """The same family with `labels` summed away (what a profile's aggregation serves)."""
        return dataclasses.replace(self, labels=tuple(x for x in self.labels if x not in labels))

    def info(self, value: Mapping[str, str] | None = None,
             by: tuple[str, ...] = ()) -> InfoMetricFamily:
        """The info family: `by` the labels `add_metric` takes as a list (a prefix of
        the declared ones), the rest in its dict; `value` for one series of no `by`."""
        self._expect("info")
        if self.labels[:len(by)] != by:
            raise ValueError(f"{self.name}: {by} do not begin its labels {self.labels}")
        if value is not None and set(value) != set(self.labels):
            raise ValueError(f"{self.name}: {sorted(value)} are not its labels "
                             f"{self.labels}")
        return InfoMetricFamily(self.base, self.help, value=dict(value or {}) or None,
                                labels=list(by) if by else None)


def by_name(declared: tuple[Family, ...]) -> dict[str, Family]:
    """The families of some `DECLARED` tuples by name; one declared twice is refused."""
    out: dict[str, Family] = {}
    for family in declared:
        if family.name in out:
            raise ValueError(f"{family.name} is declared twice")
        out[family.name] = family
    return out
