"""Board checks read once a minute: NVLink fabric registration and health
(nvmlDeviceGetGpuFabricInfoV) and InfoROM validity (nvmlDeviceValidateInforom)."""

from __future__ import annotations

from exporter.health.context import Check, GpuInputs
from exporter.health.model import (
    FAILED,
    NOT_APPLICABLE,
    OK,
    UNKNOWN,
    Outcome,
)

# a PCIe card, or a driver or bindings without the call: there is no fabric to judge
NO_FABRIC = ("NotSupported", "FunctionNotFound")


def nvlink_fabric(c: GpuInputs) -> Outcome:
    """Failed unless registered (state completed, status Success) with a healthy mask;
    not_applicable where the GPU has no fabric (PCIe cards)."""
    board = c.snapshot.board.get(c.gpu)
    if board is None:
        return Outcome(UNKNOWN, reason="fabric not read")
    fabric = board.fabric
    if fabric is None:
        if board.fabric_error in NO_FABRIC:
            return Outcome(NOT_APPLICABLE)
        return Outcome(UNKNOWN, reason="fabric not read")
    if fabric.state == "not_supported":
        return Outcome(NOT_APPLICABLE, fabric.state)
    if fabric.state != "completed":
        return Outcome(FAILED, fabric.state, "completed",
                       reason="NVLink fabric not registered")
    if fabric.status != "Success":
        return Outcome(FAILED, fabric.status, "Success",
                       reason="NVLink fabric registration failed")
    bad = fabric.degradations
    if bad:
        return Outcome(FAILED, ",".join(bad), "healthy", reason="NVLink fabric degraded")
    return Outcome(OK, fabric.state, "completed")


def inforom(c: GpuInputs) -> Outcome:
    board = c.snapshot.board.get(c.gpu)
    if board is None:
        return Outcome(UNKNOWN, reason="InfoROM not read")
    if board.inforom_valid is None:
        if board.inforom_error in NO_FABRIC:
            return Outcome(NOT_APPLICABLE)
        return Outcome(UNKNOWN, reason="InfoROM not read")
    if not board.inforom_valid:
        return Outcome(FAILED, "corrupted", "valid", reason="InfoROM corrupted")
    return Outcome(OK, "valid", "valid")


CHECKS = (
    Check("nvlink_fabric", "NVML nvmlDeviceGetGpuFabricInfoV: state COMPLETED, status "
          "SUCCESS, no degradation in the health mask", nvlink_fabric),
    Check("inforom", "NVML nvmlDeviceValidateInforom", inforom),
)
