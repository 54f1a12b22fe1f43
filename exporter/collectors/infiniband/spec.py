"""The infiniband collector's spec: its flag, options, factory and families."""

from __future__ import annotations

from exporter.collectors.infiniband.families import infiniband_families
from exporter.collectors.infiniband.reading import InfinibandSource
from exporter.collectors.registry import CollectorSpec
from exporter.options import Option

SPEC = CollectorSpec(
    name="infiniband",
    help="InfiniBand/RoCE port counters and state from sysfs",
    default=True,
    factory=lambda config, context: InfinibandSource(config.path_sysfs),
    families=lambda reading, snapshot: infiniband_families(reading),
    options=(Option("path_sysfs", "--path.sysfs", str, "/sys",
                    "sysfs mount point (as node_exporter's flag)", metavar="DIR"),),
)
