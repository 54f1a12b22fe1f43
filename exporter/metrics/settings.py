"""Which metric families are served: the profile and the selection file over it, and
another exporter's families beside ours (compat)."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.families import DEFAULT_PROFILE, PROFILES
from exporter.options import RUN, SIMULATE, setting

# --metrics.compat's choices, here and not in metrics/compat/dcgm.py: the settings are
# read at every start, the compat module and its tables only where it is chosen
DCGM_EXPORTER = "dcgm-exporter"
NONE = "none"
CHOICES = (NONE, DCGM_EXPORTER)
HOSTNAME_LABELS = ("Hostname", "hostname")  # dcgm-exporter's older and newer spelling


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
    compat: str = setting(
        NONE, "also serve another exporter's families from the same readings: dcgm-exporter "
        "(its DCGM_FI_* names, units and labels, for dashboards, alerts and autoscalers "
        "written for it; docs/migrating-from-dcgm-exporter.md)", key="metrics_compat",
        flag="--metrics.compat", choices=CHOICES, metavar="EXPORTER",
        commands=(RUN, SIMULATE))
    compat_hostname_label: str = setting(
        HOSTNAME_LABELS[0], "the node-name label of the compat families: Hostname "
        "(dcgm-exporter's long-standing spelling) or hostname (as its newest releases "
        "spell it)",
        key="metrics_compat_hostname_label", flag="--metrics.compat-hostname-label",
        choices=HOSTNAME_LABELS, metavar="LABEL", commands=(RUN, SIMULATE))
