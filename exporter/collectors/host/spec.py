"""The host collector's spec: its flag, settings, factory and families."""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.collectors.host.families import host_families
from exporter.collectors.host.reading import DEFAULT_NETWORK_EXCLUDE, HostCollector
from exporter.collectors.registry import CollectorSpec
from exporter.options import setting


def _network_exclude_problem(text: str) -> str | None:
    try:
        re.compile(text)
    except re.error as exc:
        return f"invalid regular expression: {exc}"
    return None


@dataclass(frozen=True)
class HostSettings:
    network_exclude: str = setting(
        DEFAULT_NETWORK_EXCLUDE, "network interfaces to leave out, a regex (loopback and "
        "container/VM interfaces)", key="host_network_exclude",
        flag="--collector.host.network-exclude", metavar="REGEX",
        check=_network_exclude_problem)


SPEC = CollectorSpec(
    name="host",
    help="CPU, memory, load and per-interface network figures through psutil",
    default=True,
    factory=lambda settings, context: HostCollector(settings.network_exclude),
    families=lambda reading, snapshot: host_families(reading),
    settings=HostSettings,
)
