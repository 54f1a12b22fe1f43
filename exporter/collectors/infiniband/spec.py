"""The InfiniBand collector's spec: its flag, settings, factory and families."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.collectors.infiniband.families import infiniband_families
from exporter.collectors.infiniband.reading import InfinibandCollector
from exporter.collectors.registry import CollectorSpec
from exporter.options import setting


@dataclass(frozen=True)
class InfinibandSettings:
    sysfs: str = setting("/sys", "sysfs mount point (as node_exporter's flag)",
                         key="path_sysfs", flag="--path.sysfs", metavar="DIR")


SPEC = CollectorSpec(
    name="infiniband",
    help="InfiniBand/RoCE port counters and state from sysfs",
    default=True,
    factory=lambda settings, context: InfinibandCollector(settings.sysfs),
    families=lambda reading, snapshot: infiniband_families(reading),
    settings=InfinibandSettings,
)
