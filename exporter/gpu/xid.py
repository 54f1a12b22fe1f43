"""XID codes and their severity class (NVIDIA's XID catalog, Ampere and newer, by the
immediate action it asks for: docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html).

The class is exported as a label on the XID counter so rules can alert on
`class="critical"` without hard-coding code lists.
"""

from __future__ import annotations

CRITICAL = frozenset({46, 48, 62, 64, 74, 79, 95, 109, 119, 120, 136, 140, 143,
                      144, 145, 146, 147, 148, 149, 150, 155, 156, 158})
# 154 carries its recovery action in the driver's text, which NVML events do not; the
# action is read from NVML instead (gpu_recovery_action). 162-165: power smoothing.
WARNING = frozenset({92, 94, 154, 157, 162, 163, 164, 165})
APPLICATION = frozenset({13, 31, 43, 45, 63})

MEANINGS = {
    13: "graphics engine exception (usually the application)",
    31: "GPU memory page fault (usually the application)",
    43: "GPU stopped processing (application)",
    45: "preemptive cleanup after a previous error",
    46: "GPU stopped processing",
    48: "double-bit ECC error (DBE)",
    62: "internal micro-controller halt",
    63: "row remapping event (ECC page retirement recorded)",
    64: "row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (restart the application)",
    95: "uncontained ECC error (reset the GPU)",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    154: "GPU recovery action changed",
}


def xid_class(code: int) -> str:
    if code in CRITICAL:
        return "critical"
    if code in WARNING:
        return "warning"
    if code in APPLICATION:
        return "application"
    return "unknown"


# What each XID asks of the operator, for the health verdict (exporter/health/): the
# state it puts the GPU in and the action, from NVIDIA's XID catalog ("immediate action":
# RESTART_APP, RESET_GPU, RESTART_BM, CONTACT_SUPPORT) and DCGM 4.x's health watches
# (modules/health/DcgmHealthWatch.cpp: always FAIL on 48, 74, 79, 95, 119, 120, 140; WARN
# on 94; memory watch WARN on 31, 32, 43, 63, FAIL on 64; PCIe watch WARN on 38, 39, 42).
# The application XIDs (13, 31, 43, 45) never fail a GPU on their own. Codes not here:
# critical ones fail with a GPU reset, the rest warn (the class says how bad).
RESTART_APPLICATION, RESET_GPU, REBOOT_NODE, DRAIN_AND_SERVICE = (
    "restart_application", "reset_gpu", "reboot_node", "drain_and_service")
ACTIONS: dict[int, tuple[str, str]] = {
    13: ("ok", "restart_application"),  # the application's own fault: nothing on the GPU
    45: ("ok", "none"),  # cleanup after another error, which carries the verdict
    31: ("warning", RESTART_APPLICATION), 43: ("warning", RESTART_APPLICATION),
    32: ("warning", RESTART_APPLICATION),
    38: ("warning", RESET_GPU), 39: ("warning", RESET_GPU), 42: ("warning", RESET_GPU),
    63: ("warning", RESET_GPU),  # a row remap waits for the next reset
    92: ("warning", "none"),
    94: ("warning", RESTART_APPLICATION),  # contained: only the affected application
    154: ("warning", "none"),  # the recovery action itself is judged from NVML's field
    157: ("warning", "none"),
    162: ("warning", DRAIN_AND_SERVICE), 163: ("warning", DRAIN_AND_SERVICE),
    164: ("warning", DRAIN_AND_SERVICE), 165: ("warning", DRAIN_AND_SERVICE),
    46: ("failed", RESET_GPU), 48: ("failed", RESET_GPU), 62: ("failed", RESET_GPU),
    64: ("failed", DRAIN_AND_SERVICE),  # row remap failure: the GPU needs replacing
    74: ("failed", RESET_GPU), 79: ("failed", REBOOT_NODE), 95: ("failed", RESET_GPU),
    109: ("failed", RESET_GPU), 119: ("failed", RESET_GPU), 120: ("failed", RESET_GPU),
    136: ("failed", RESET_GPU), 140: ("failed", RESET_GPU), 143: ("failed", RESET_GPU),
    **{code: ("failed", RESET_GPU) for code in range(144, 151)},  # NVLink5
    155: ("failed", RESET_GPU), 156: ("failed", REBOOT_NODE), 158: ("failed", REBOOT_NODE),
}


def xid_action(code: int) -> tuple[str, str]:
    """(health state, action) the XID asks for."""
    found = ACTIONS.get(code)
    if found is not None:
        return found
    return ("failed", RESET_GPU) if code in CRITICAL else ("warning", "none")
