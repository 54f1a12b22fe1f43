"""The node's own checks: GPUs missing, the NVLink fabric as a whole, InfiniBand ports
down and their link errors (NVSentinel's NIC monitor; the rules in alerts/fabric.yml are
generated from the same settings)."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.collectors.infiniband.reading import InfinibandPort, InfinibandReading
from exporter.health.context import Check
from exporter.health.counters import CounterPoints
from exporter.health.model import (
    DRAIN_AND_SERVICE,
    FAILED,
    NONE,
    NOT_APPLICABLE,
    OK,
    REBOOT_NODE,
    RESET_GPU,
    UNKNOWN,
    WARNING,
    Outcome,
    Verdict,
)
from exporter.health.settings import HealthSettings
from exporter.sampling.snapshot import Snapshot

# Any increase of these within the window is a port in trouble (NVSentinel's NIC monitor;
# rnr_nak_retry_err is a hw_counter); the rates below are judged over the same window, the
# fabric alerts' 5 minutes.
IB_LINK_ERRORS = ("link_downed", "excessive_buffer_overrun_errors",
                  "local_link_integrity_errors", "rnr_nak_retry_err")
IB_WINDOW_SECONDS = 300.0


@dataclass(frozen=True)
class NodeInputs:
    snapshot: Snapshot
    settings: HealthSettings
    gpus: dict[int, Verdict]
    counters: CounterPoints

    def increase(self, name: str, value: float, window: float) -> tuple[float, float] | None:
        """(increase, seconds) of a node counter over `window`, None before a second read."""
        key = (None, name)
        self.counters.observe(key, self.snapshot.time, value, window)
        return self.counters.increase(key, window)


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


def infiniband_ports_of(snapshot: Snapshot) -> list[InfinibandPort]:
    readings = [r.reading for r in snapshot.collectors.values()
                if isinstance(r.reading, InfinibandReading)]
    return [p for reading in readings for d in reading.devices for p in d.ports]


def infiniband_ports(c: NodeInputs) -> Outcome:
    """Ports whose state is DOWN (1), as the InfinibandPortDown alert has it."""
    ports = [p for p in infiniband_ports_of(c.snapshot) if p.state_id is not None]
    if not ports:
        return Outcome(NOT_APPLICABLE, threshold=0)
    down = [f"{p.device}/{p.port}" for p in ports if p.state_id == 1]
    if down:
        return Outcome(FAILED, " ".join(sorted(down)), 0, DRAIN_AND_SERVICE,
                       "InfiniBand port down")
    return Outcome(OK, 0, 0)


def infiniband_link_errors(c: NodeInputs) -> Outcome:
    """Any link error (IB_LINK_ERRORS) in the window fails; symbol errors or link error
    recoveries past their settings' rates warn. The value names the ports and counters."""
    s = c.settings
    failed, warned, known = [], [], False
    for p in infiniband_ports_of(c.snapshot):
        port = f"{p.device}/{p.port}"
        for name in IB_LINK_ERRORS:
            value = p.counters.get(name, p.hw_counters.get(name))
            seen = None if value is None else c.increase(f"{port} {name}", value,
                                                          IB_WINDOW_SECONDS)
            known |= seen is not None
            if seen is not None and seen[0] > 0:
                failed.append(f"{port} {name}")
        for name, per_second, limit in (
                ("symbol_error", 1.0, s.infiniband_symbol_errors_per_second),
                ("link_error_recovery", 60.0, s.infiniband_link_error_recovery_per_minute)):
            value = p.counters.get(name)
            seen = None if value is None else c.increase(f"{port} {name}", value,
                                                          IB_WINDOW_SECONDS)
            known |= seen is not None
            if seen is not None and seen[0] / seen[1] * per_second > limit:
                warned.append(f"{port} {name}")
    if failed:
        return Outcome(FAILED, " ".join(failed), 0, DRAIN_AND_SERVICE,
                       "InfiniBand link errors")
    if warned:
        return Outcome(WARNING, " ".join(warned), None, NONE, "InfiniBand error rate high")
    if not known:
        ports = infiniband_ports_of(c.snapshot)
        return (Outcome(UNKNOWN, reason="InfiniBand error rates not known yet") if ports
                else Outcome(NOT_APPLICABLE))
    return Outcome(OK, 0, 0)


CHECKS = (
    Check("gpu_count", "NVML's device count against --gpus.expected", gpu_count),
    Check("nvlink_fabric", "NVML nvmlDeviceGetGpuFabricInfoV of every GPU: one cluster, "
          "all registered", nvlink_fabric),
    Check("infiniband_ports", "InfinibandPortDown rule: port state DOWN", infiniband_ports),
    Check("infiniband_link_errors", "NVSentinel's NIC monitor: any link_downed, buffer "
          "overrun, link integrity or RNR retry error in 5 minutes fails; symbol errors and "
          "link error recoveries past their rates warn", infiniband_link_errors),
)
