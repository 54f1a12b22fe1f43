"""The host collector's spec: its flag, options, factory and families."""

from __future__ import annotations

import re

from exporter.collectors.host.families import host_families
from exporter.collectors.host.reading import DEFAULT_NETWORK_EXCLUDE, HostSource
from exporter.collectors.registry import CollectorSpec
from exporter.options import Option


def _network_exclude_problem(text: str) -> str | None:
    try:
        re.compile(text)
    except re.error as exc:
        return f"invalid regular expression: {exc}"
    return None


SPEC = CollectorSpec(
    name="host",
    help="CPU, memory, load and per-interface network figures through psutil",
    default=True,
    factory=lambda config, context: HostSource(config.host_network_exclude),
    families=lambda reading, snapshot: host_families(reading),
    options=(Option("host_network_exclude", "--collector.host.network-exclude", str,
                    DEFAULT_NETWORK_EXCLUDE, "network interfaces to leave out, a regex (loopback "
                    "and container/VM interfaces)", metavar="REGEX",
                    check=_network_exclude_problem),),
)
