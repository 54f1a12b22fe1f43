"""The node's own checks: GPUs missing (more to come: fabric, InfiniBand ports)."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.health.context import Check
from exporter.health.model import FAILED, OK, REBOOT_NODE, Outcome, Verdict
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


CHECKS = (
    Check("gpu_count", "NVML's device count against --gpus.expected", gpu_count),
)
