"""The history's settings, each declared once."""

from __future__ import annotations

import os
from dataclasses import dataclass

from exporter.options import RUN, setting

AUTO = "auto"
DEFAULT_DIRECTORY = "/var/lib/cluster-telemetry-exporter"
KMSG = "/dev/kmsg"


@dataclass(frozen=True)
class HistorySettings:
    storage_path: str = setting(
        AUTO, "state directory for the history that survives restarts (docs/history.md); "
        "auto: $STATE_DIRECTORY (systemd) or /var/lib/cluster-telemetry-exporter on NVML, "
        "none on --fake or --replay; empty: keep no history", flag="--storage.path",
        metavar="DIR", commands=(RUN,))
    kmsg_path: str = setting(
        AUTO, "the kernel log read for XIDs, with a state directory or without (a regular "
        "file stands in for tests); auto: /dev/kmsg on NVML, none on --fake or --replay; "
        "empty: read none",
        flag="--storage.kmsg-path", key="storage_kmsg_path", metavar="FILE", commands=(RUN,))
    boot_id_path: str = setting(
        "/proc/sys/kernel/random/boot_id", "the file that names this boot (the kernel "
        "log's sequence restarts at boot)", flag="--storage.boot-id-path",
        key="storage_boot_id_path", metavar="FILE",
        commands=(RUN,))

    def kernel_log(self, backend: str) -> str:
        """The kernel log to read, "" for none."""
        if self.kmsg_path != AUTO:
            return self.kmsg_path
        return KMSG if backend == "nvml" else ""

    def directory(self, backend: str) -> str:
        """The state directory to use, "" for none."""
        if self.storage_path != AUTO:
            return self.storage_path
        if backend != "nvml":
            return ""
        return os.environ.get("STATE_DIRECTORY", "").split(":")[0] or DEFAULT_DIRECTORY
