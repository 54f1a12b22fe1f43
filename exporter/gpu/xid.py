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
