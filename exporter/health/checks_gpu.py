"""The GPU's own checks: answering, XIDs by the catalog's action, the driver's recovery
action."""

from __future__ import annotations

from exporter.gpu.xid import MEANINGS
from exporter.health.context import Check, GpuInputs
from exporter.health.faults import xid_judgement
from exporter.health.model import (
    FAILED,
    NONE,
    NOT_APPLICABLE,
    OK,
    REBOOT_NODE,
    RESET_GPU,
    UNKNOWN,
    WARNING,
    Outcome,
    action_rank,
    action_words,
    state_rank,
)

# NVML's recovery action (field 230) -> (state, action)
RECOVERY = {
    "none": (OK, NONE),
    "gpu_reset": (FAILED, RESET_GPU),
    "node_reboot": (FAILED, REBOOT_NODE),
    "drain_p2p": (WARNING, NONE),  # peer-to-peer traffic stops; jobs may go on
    "drain_and_reset": (FAILED, RESET_GPU),
}
# what the driver asks for where it is no action of ours (exporter/health/model.py)
DRIVER_ONLY = {"drain_p2p": "stop peer-to-peer traffic"}


def answering(c: GpuInputs) -> Outcome:
    s = c.snapshot
    if c.gpu in s.lost:
        return Outcome(FAILED, "lost", None, REBOOT_NODE, "GPU lost (fell off the bus)")
    if c.gpu in s.hung:
        stuck = max(0.0, s.time - s.hung[c.gpu])
        return Outcome(FAILED, round(stuck, 1), None, RESET_GPU,
                       "GPU not answering (stuck in an NVML call)")
    if c.gpu >= len(s.identities) or s.identities[c.gpu] is None:
        return Outcome(UNKNOWN, reason="GPU not identified yet")
    return Outcome(OK, "answering")


def xids(c: GpuInputs) -> Outcome:
    """The worst XID seen within the hold window, by the fault table's XID columns."""
    s = c.snapshot
    since = s.time - c.settings.xid_hold_seconds
    found = []
    for (gpu, code), record in s.xids.items():
        if gpu == c.gpu and record.last_seen >= since:
            judged = xid_judgement(code)
            state, action = judged.state, judged.action
            found.append((state_rank(state), action_rank(action), code, state, action))
    if not found:
        return Outcome(OK, None, "catalog")
    *_, code, state, action = max(found)
    meaning = MEANINGS.get(code, "not in the catalog")
    if state == OK:
        return Outcome(OK, code, "catalog")
    return Outcome(state, code, "catalog", action, f"XID {code} ({meaning})")


def recovery_action(c: GpuInputs) -> Outcome:
    h = c.device_read
    if h is None:
        return Outcome(UNKNOWN, reason="recovery action not read")
    if h.recovery_action is None:
        return Outcome(NOT_APPLICABLE)
    state, action = RECOVERY.get(h.recovery_action, (WARNING, NONE))
    if state == OK:
        return Outcome(OK, h.recovery_action)
    asks = action_words(action) if action != NONE else DRIVER_ONLY.get(
        h.recovery_action, f"recover ({h.recovery_action})")
    return Outcome(state, h.recovery_action, None, action, f"driver asks to {asks}")


CHECKS = (
    Check("gpu_answering", "NVML: GPU lost (GpuIsLost) or stuck past --nvml.hang-timeout",
          answering),
    Check("xid", "NVIDIA XID catalog (immediate action); DCGM 4.x XID rules", xids),
    Check("recovery_action", "NVML: the driver's recovery action (field 230)",
          recovery_action),
)
