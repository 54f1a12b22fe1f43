"""What is collected and served: a profile (exporter/metrics/profiles.py) and, over it, a
selection file that includes or excludes families by name or glob and sums labels away.

The selection is applied before the work where the work can be skipped: NVLink fields no
wanted family needs are not read (`nvlink_reads`), and every family is filtered and
aggregated before it is written, so an unwanted family is never rendered.

A selection file (``--metrics.file``)::

    include: [gpu_nvlink_link_up]            # families added to the profile
    exclude: ["infiniband_port_*_packets_total", host_load1]
    aggregate:                               # sum a label away, as `sum without (...)`
      - families: "gpu_nvlink_*_bytes_total"
        without: [link]

An aggregation that would do nothing is refused with file and line: a label the family
does not have (exporter.metrics.family_table), or for a glob, that none of its families has.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import Metric

from exporter.families import DEFAULT_PROFILE, PROFILES
from exporter.gpu.device_read import NvlinkReads
from exporter.metrics.exposition import Rows
from exporter.metrics.family_table import LABELS, PROFILE
from exporter.metrics.profiles import AGGREGATIONS, COLLECTOR_FAMILIES
from exporter.yamlfile import ConfigError, Where, excerpt, expect_mapping, load_yaml_file

_GLOB = re.compile(r"[*?\[]")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_SUFFIXES = {"counter": "_total", "info": "_info"}


def exposed_name(metric: Metric) -> str:
    """A family's name as /metrics and docs/metrics.md write it (counters end in _total)."""
    return metric.name + _SUFFIXES.get(metric.type, "")


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


@dataclass(frozen=True)
class Selection:
    """A profile, the file's patterns over it, and the labels summed away per family."""

    profile: str = DEFAULT_PROFILE
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    aggregate: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (family pattern, labels)
    source: str = ""  # the selection file, if any
    _wants: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)
    _without: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False,
                                                 repr=False)

    def wants(self, name: str) -> bool:
        """Whether a family (by exposed name) is served; a family missing from the table
        counts as `standard`."""
        known = self._wants.get(name)
        if known is None:
            rank = PROFILES.index(PROFILE.get(name, DEFAULT_PROFILE))
            known = rank <= PROFILES.index(self.profile) or _matches(name, self.include)
            known = known and not _matches(name, self.exclude)
            self._wants[name] = known
        return known

    def without(self, name: str) -> tuple[str, ...]:
        """Labels summed away from a family, the profile's then the file's."""
        known = self._without.get(name)
        if known is None:
            labels: list[str] = []
            for pattern, drop in (*AGGREGATIONS[self.profile], *self.aggregate):
                if fnmatch.fnmatchcase(name, pattern):
                    labels += [label for label in drop if label not in labels]
            known = self._without[name] = tuple(labels)
        return known

    def apply(self, metrics: Iterable[Metric]) -> Iterator[Metric]:
        """The wanted families, each with its labels summed away."""
        for metric in metrics:
            name = exposed_name(metric)
            if not self.wants(name):
                continue
            drop = self.without(name)
            yield summed_without(metric, drop) if drop else metric

    def nvlink_reads(self) -> NvlinkReads:
        """The NVLink fields this selection needs read; the health verdict's NVLink checks
        need the link states and errors whenever a verdict family is served."""
        traffic = [n for n in ("gpu_nvlink_transmit_bytes_total",
                               "gpu_nvlink_receive_bytes_total") if self.wants(n)]
        verdict = any(self.wants(n) for n in ("gpu_health_state", "gpu_health_action",
                                              "gpu_health_check_state",
                                              "gpu_node_health_state",
                                              "gpu_node_health_action",
                                              "gpu_node_health_check_state"))
        return NvlinkReads(
            state=(self.wants("gpu_nvlink_link_up") or self.wants("gpu_nvlink_links_active")
                   or verdict),
            errors=self.wants("gpu_nvlink_errors_total") or verdict,
            traffic=bool(traffic),
            traffic_per_link=any("link" not in self.without(n) for n in traffic))

    def needs_collector(self, name: str) -> bool:
        """Whether a collector's readings feed a served family (those of
        COLLECTOR_FAMILIES only when one of theirs is; every other one always)."""
        pattern = COLLECTOR_FAMILIES.get(name)
        return pattern is None or any(self.wants(family) for family in PROFILE
                                      if fnmatch.fnmatchcase(family, pattern))

    def describe(self) -> str:
        """One phrase for logs and check-config."""
        extra = ", ".join(f"{len(v)} {k}" for k, v in (
            ("include", self.include), ("exclude", self.exclude),
            ("aggregation(s)", self.aggregate)) if v)
        return f"profile {self.profile}" + (f" with {self.source} ({extra or 'empty'})"
                                            if self.source else "")


def summed_without(metric: Metric, drop: tuple[str, ...]) -> Metric:
    """A gauge or counter family with `drop` labels summed away (series order kept);
    any other family, or one without those labels, as it is."""
    if metric.type not in ("gauge", "counter"):
        return metric
    if isinstance(metric, Rows):
        names, rows = metric.labelnames, metric.rows
    else:
        if not metric.samples:
            return metric
        names = tuple(metric.samples[0].labels)
        rows = [(tuple(s.labels.get(n, "") for n in names), s.value) for s in metric.samples
                if s.name == metric.samples[0].name]
    keep = [i for i, label in enumerate(names) if label not in drop]
    if len(keep) == len(names):
        return metric
    sums: dict[tuple[str, ...], float] = {}
    for values, value in rows:
        key = tuple(values[i] for i in keep)
        sums[key] = sums.get(key, 0.0) + value
    out = Rows(metric.name, metric.documentation, metric.type, [names[i] for i in keep])
    out.rows = list(sums.items())
    return out


# -- loading and checking a selection file ---------------------------------------------

def _known_family(name: str) -> str | None:
    """Why a plain family name is not one (with a suggestion), or None."""
    if name in PROFILE:
        return None
    import difflib  # only for an unknown name

    close = difflib.get_close_matches(name, list(PROFILE), n=1, cutoff=0.6)
    return "unknown family" + (f" (did you mean {close[0]}?)" if close else "")


def _patterns(mapping: dict, key: str, where: Where) -> tuple[str, ...]:
    value = mapping.get(key, [])
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise where.error(key, f"expected a list of family names or globs, got "
                               f"{excerpt(value)}")
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            raise where.error(key, f"item {i + 1}: expected a family name or glob, got "
                                   f"{excerpt(item)}", item=i)
        if _GLOB.search(item):
            if not any(fnmatch.fnmatchcase(name, item) for name in PROFILE):
                raise where.error(key, f"item {i + 1}: {excerpt(item)} matches no family",
                                  item=i)
        elif problem := _known_family(item):
            raise where.error(key, f"item {i + 1}: {excerpt(item)}: {problem}", item=i)
    return tuple(items)


def _aggregations(mapping: dict, where: Where) -> tuple[tuple[str, tuple[str, ...]], ...]:
    value = mapping.get("aggregate", [])
    if not isinstance(value, list):
        raise where.error("aggregate", f"expected a list of {{families, without}}, got "
                                       f"{excerpt(value)}")
    out = []
    for i, entry in enumerate(value):
        here = where.child(f"aggregate[{i + 1}]", entry)
        if not isinstance(entry, dict):
            raise here.error(None, f"expected a mapping with families and without, got "
                                   f"{excerpt(entry)}")
        expect_mapping(entry, here, {"families", "without"})
        for key in ("families", "without"):
            if key not in entry:
                raise here.error(None, f"{key} is missing")
        families = _patterns(entry, "families", here)
        labels = entry["without"]
        labels = [labels] if isinstance(labels, str) else labels
        if not isinstance(labels, list) or not labels or not all(
                isinstance(x, str) and _LABEL.fullmatch(x) for x in labels):
            raise here.error("without", f"expected one or more label names, got "
                                        f"{excerpt(entry['without'])}")
        for pattern in families:
            if problem := _labels_problem(pattern, labels):
                raise here.error("without", problem)
        out += [(pattern, tuple(labels)) for pattern in families]
    return tuple(out)


def _labels_problem(pattern: str, labels: list[str]) -> str | None:
    """Why summing `labels` away from the families `pattern` names would do nothing, or
    None. A glob may match families without the label: it needs one that has it."""
    matched = [name for name in PROFILE if fnmatch.fnmatchcase(name, pattern)]
    known = [LABELS[name] for name in matched]  # the table has every family PROFILE has
    for label in labels:
        if any(label in have for have in known):
            continue
        if not _GLOB.search(pattern):
            have = ", ".join(known[0]) or "none"
            return f"{excerpt(label)} is not a label of {pattern} (its labels: {have})"
        return (f"{excerpt(label)} is a label of none of the {len(matched)} families "
                f"{excerpt(pattern)} matches")
    return None


def load_selection(profile: str = DEFAULT_PROFILE, path: str = "") -> Selection:
    """The profile with the selection file over it (none when `path` is empty); a bad
    file raises ConfigError naming file, line and key."""
    if profile not in PROFILES:
        raise ConfigError(f"metrics profile {excerpt(profile)}: expected one of "
                          f"{', '.join(PROFILES)}")
    if not path:
        return Selection(profile)
    data: Any = load_yaml_file(path)
    where = Where(str(path), data)
    mapping = expect_mapping(data, where, {"include", "exclude", "aggregate"})
    return Selection(profile, _patterns(mapping, "include", where),
                     _patterns(mapping, "exclude", where), _aggregations(mapping, where),
                     source=str(path))
