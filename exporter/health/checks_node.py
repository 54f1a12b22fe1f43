"""The node's own checks: GPUs missing, the NVLink fabric as a whole, InfiniBand ports
down."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.collectors.infiniband.reading import InfinibandReading
from exporter.health.context import Check
from exporter.health.model import (
    DRAIN_AND_SERVICE,
    FAILED,
    NOT_APPLICABLE,
    OK,
    REBOOT_NODE,
    RESET_GPU,
    UNKNOWN,
    Outcome,
    Verdict,
)
from exporter.health.settings import HealthSettings
from exporter.sampling.snapshot import Snapshot


@dataclass(frozen=True)
class NodeInputs:
    snapshot: Snapshot
    settings: HealthSettings
    gpus: dict[int, Verdict]


def gpu_count(c: NodeInputs) -> Outcome:
    s = c.snapshot
    if s.gpu_count < s.expected_gpus:
        return Outcome(FAILED, s.gpu_count, s.expected_gpus, REBOOT_NODE,
                       "fewer GPUs than expected")
    return Outcome(OK, s.gpu_count, s.expected_gpus)


def nvlink_fabric(c: NodeInputs) -> Outcome:
    """The node's GPUs in one fabric: all registered, in one cluster. Not applicable
    where no GPU has a fabric (PCIe cards)."""
    checks = [check for v in c.gpus.values() for check in v.checks
              if check.name == "nvlink_fabric"]
    if not checks or all(check.state == NOT_APPLICABLE for check in checks):
        return Outcome(NOT_APPLICABLE)
    clusters = {board.fabric.cluster_uuid for board in c.snapshot.board.values()
                if board.fabric is not None and board.fabric.state == "completed"}
    if len(clusters) > 1:
        return Outcome(FAILED, len(clusters), 1, DRAIN_AND_SERVICE,
                       "GPUs registered in different NVLink fabrics")
    failed = sum(check.state == FAILED for check in checks)
    if failed:
        return Outcome(FAILED, failed, 0, RESET_GPU, "NVLink fabric incomplete")
    if any(check.state == UNKNOWN for check in checks):
        return Outcome(UNKNOWN, reason="NVLink fabric not read")
    return Outcome(OK, next(iter(clusters), ""), "one fabric")


def infiniband_ports(c: NodeInputs) -> Outcome:
    """Ports whose state is DOWN (1), as the InfinibandPortDown alert has it."""
    readings = [r.reading for r in c.snapshot.collectors.values()
                if isinstance(r.reading, InfinibandReading)]
    ports = [p for reading in readings for d in reading.devices for p in d.ports
             if p.state_id is not None]
    if not ports:
        return Outcome(NOT_APPLICABLE, threshold=0)
    down = [f"{p.device}/{p.port}" for p in ports if p.state_id == 1]
    if down:
        return Outcome(FAILED, " ".join(sorted(down)), 0, DRAIN_AND_SERVICE,
                       "InfiniBand port down")
    return Outcome(OK, 0, 0)


CHECKS = (
    Check("gpu_count", "NVML's device count against --gpus.expected", gpu_count),
    Check("nvlink_fabric", "NVML nvmlDeviceGetGpuFabricInfoV of every GPU: one cluster, "
          "all registered", nvlink_fabric),
    Check("infiniband_ports", "InfinibandPortDown rule: port state DOWN", infiniband_ports),
)
