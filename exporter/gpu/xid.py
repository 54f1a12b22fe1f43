"""The XID table: one row per code (its meaning, class, the state it puts the GPU in and
the action it asks for), from NVIDIA's XID catalog (Ampere and newer, by the immediate
action it asks for: docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) and
DCGM 4.x's health watches (modules/health/DcgmHealthWatch.cpp: always FAIL on 48, 74, 79,
95, 119, 120, 140; WARN on 94; memory watch WARN on 31, 32, 43, 63, FAIL on 64; PCIe watch
WARN on 38, 39, 42). The fault table's XID columns (exporter/health/faults.py,
`xid_judgement`) read the state and the action from it: the health verdict's `xid` check,
the alerts on that check, the live page's finding severity and the lemon score's XID
weights. The class is served as the XID counter's `class` label, the catalog's words for
dashboards; nothing judges by it.

Two lists of codes stand apart on purpose: dcgm-exporter's own `err_msg` wording
(exporter/metrics/compat/xid_messages.csv, served as that exporter serves it) and the
sticky XIDs NVSentinel merges over hours (exporter/history/episodes.py).

How a state maps to the one severity vocabulary (critical, warning, info) is in
docs/health.md ("One vocabulary").
"""

from __future__ import annotations

from dataclasses import dataclass

RESTART_APPLICATION, RESET_GPU, REBOOT_NODE, DRAIN_AND_SERVICE = (
    "restart_application", "reset_gpu", "reboot_node", "drain_and_service")
# The actions that say the GPU (not the application) is at fault: an XID asking for one
# counts in the lemon score.
HARDWARE_ACTIONS = frozenset({RESET_GPU, REBOOT_NODE, DRAIN_AND_SERVICE})


@dataclass(frozen=True)
class Xid:
    meaning: str | None  # None: the catalog's own words are not copied here
    klass: str  # critical, warning, application or unknown (the counter's `class` label)
    state: str  # the health state it puts the GPU in: ok, warning or failed
    action: str  # the action it asks for (exporter/health/model.py's ACTIONS)

    @property
    def lemon(self) -> bool:
        """Counts against the GPU in the lemon score: not ok, and a hardware action."""
        return self.state != "ok" and self.action in HARDWARE_ACTIONS


TABLE: dict[int, Xid] = {
    # application: the application's own fault, nothing on the GPU (13, 45), or one that
    # only the affected application must restart for
    13: Xid("graphics engine exception (usually the application)", "application", "ok",
             RESTART_APPLICATION),
    31: Xid("GPU memory page fault (usually the application)", "application", "warning",
             RESTART_APPLICATION),
    43: Xid("GPU stopped processing (application)", "application", "warning",
             RESTART_APPLICATION),
    45: Xid("preemptive cleanup after a previous error", "application", "ok", "none"),
    # a row remap waits for the next reset
    63: Xid("row remapping event (ECC page retirement recorded)", "application", "warning",
             RESET_GPU),
    # DCGM's memory and PCIe watches warn on these; the catalog gives them no class
    32: Xid(None, "unknown", "warning", RESTART_APPLICATION),
    38: Xid(None, "unknown", "warning", RESET_GPU),
    39: Xid(None, "unknown", "warning", RESET_GPU),
    42: Xid(None, "unknown", "warning", RESET_GPU),
    92: Xid("high single-bit ECC error rate", "warning", "warning", "none"),
    # contained: only the affected application
    94: Xid("contained ECC error (restart the application)", "warning", "warning",
             RESTART_APPLICATION),
    # 154 carries its recovery action in the driver's text, which NVML events do not; the
    # action is read from NVML instead (gpu_recovery_action)
    154: Xid("GPU recovery action changed", "warning", "warning", "none"),
    157: Xid(None, "warning", "warning", "none"),
    # 162-165: power smoothing
    **{code: Xid(None, "warning", "warning", DRAIN_AND_SERVICE) for code in range(162, 166)},
    46: Xid("GPU stopped processing", "critical", "failed", RESET_GPU),
    48: Xid("double-bit ECC error (DBE)", "critical", "failed", RESET_GPU),
    62: Xid("internal micro-controller halt", "critical", "failed", RESET_GPU),
    # row remap failure: the GPU needs replacing
    64: Xid("row remapping failure", "critical", "failed", DRAIN_AND_SERVICE),
    74: Xid("NVLink error", "critical", "failed", RESET_GPU),
    79: Xid("GPU has fallen off the bus", "critical", "failed", REBOOT_NODE),
    95: Xid("uncontained ECC error (reset the GPU)", "critical", "failed", RESET_GPU),
    109: Xid("context switch timeout", "critical", "failed", RESET_GPU),
    119: Xid("GSP RPC timeout", "critical", "failed", RESET_GPU),
    120: Xid("GSP error", "critical", "failed", RESET_GPU),
    136: Xid(None, "critical", "failed", RESET_GPU),
    140: Xid(None, "critical", "failed", RESET_GPU),
    143: Xid(None, "critical", "failed", RESET_GPU),
    **{code: Xid(None, "critical", "failed", RESET_GPU) for code in range(144, 151)},  # NVLink5
    155: Xid(None, "critical", "failed", RESET_GPU),
    156: Xid(None, "critical", "failed", REBOOT_NODE),
    158: Xid(None, "critical", "failed", REBOOT_NODE),
}
# A code the table lacks: it warns, asks for nothing, and its class is unknown.
UNLISTED = Xid(None, "unknown", "warning", "none")

# Views kept for readers that want one column.
CRITICAL = frozenset(c for c, row in TABLE.items() if row.klass == "critical")
WARNING = frozenset(c for c, row in TABLE.items() if row.klass == "warning")
APPLICATION = frozenset(c for c, row in TABLE.items() if row.klass == "application")
MEANINGS = {c: row.meaning for c, row in TABLE.items() if row.meaning is not None}


def xid_row(code: int) -> Xid:
    return TABLE.get(code, UNLISTED)


def xid_class(code: int) -> str:
    return xid_row(code).klass


def meaning(code: int) -> str:
    return xid_row(code).meaning or "see NVIDIA's XID catalog"
