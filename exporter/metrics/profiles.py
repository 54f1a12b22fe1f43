"""The profiles, and the label aggregations of each.

A profile includes its own families and those of every smaller one: `minimal` is for the
largest fleets (what the node-level alerts need to find a broken GPU, link or port),
`standard` (the default) is everything the shipped alerts, recording rules and dashboards
query, `full` is every family, NVLink per link included. Each family's profile is in its
declaration (exporter/families.py); exporter/metrics/family_table.py has them all, by
name. tests/test_selection.py checks that `standard` serves what the rules and dashboards
query.
"""

from __future__ import annotations

from exporter.families import FULL, MINIMAL, STANDARD

# Label aggregations a profile applies (family, labels summed away), as PromQL's
# `sum without (...)`: NVLink counters per GPU instead of per link. `full` has none.
AGGREGATIONS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    MINIMAL: (("gpu_nvlink_errors_total", ("link",)),),
    STANDARD: (("gpu_nvlink_errors_total", ("link",)),
               ("gpu_nvlink_transmit_bytes_total", ("link",)),
               ("gpu_nvlink_receive_bytes_total", ("link",))),
    FULL: (),
}

# Collectors that only feed their own families (nothing else reads their readings): not
# started when a selection serves none of these.
COLLECTOR_FAMILIES: dict[str, str] = {"infiniband": "infiniband_*", "host": "host_*"}
