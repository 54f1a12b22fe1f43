"""Which metric families are served: the profile and the selection file over it."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.families import DEFAULT_PROFILE, PROFILES
from exporter.options import RUN, SIMULATE, setting


@dataclass(frozen=True)
class MetricsSettings:
    profile: str = setting(
        DEFAULT_PROFILE, "families served: minimal (the largest fleets), standard (what "
        "every shipped alert, recording rule and dashboard needs) or full (NVLink per link "
        "and every diagnostic); docs/metrics.md says which family is in which",
        key="metrics_profile", flag="--metrics.profile", choices=PROFILES, metavar="PROFILE",
        commands=(RUN, SIMULATE))
    file: str = setting(
        "", "a selection over the profile: families included or excluded by name or glob, "
        "labels summed away (docs/metrics.md); reloaded on SIGHUP", key="metrics_file",
        flag="--metrics.file", metavar="FILE", commands=(RUN, SIMULATE))
