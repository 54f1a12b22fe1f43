"""The node's own checks: GPUs missing, the NVLink fabric as a whole; and each InfiniBand
port's: down or not active, link errors and error rates (NVSentinel's NIC monitor)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from exporter.collectors.infiniband.reading import InfinibandPort, InfinibandReading
from exporter.health.context import Check
from exporter.health.counters import CounterPoints
from exporter.health.model import (
    DRAIN_AND_SERVICE,
    FAILED,
    NOT_APPLICABLE,
    OK,
    RESET_GPU,
    UNKNOWN,
    WARNING,
    Outcome,
    Verdict,
)
from exporter.health.settings import HealthSettings
from exporter.sampling.snapshot import Snapshot

# The port checks compare counters over 5 minutes (NVSentinel's NIC monitor; rnr_nak_retry_err
# is a hw_counter).
IB_WINDOW_SECONDS = 300.0


@dataclass(frozen=True)
class NodeInputs:
    snapshot: Snapshot
    settings: HealthSettings
    gpus: dict[int, Verdict]
    counters: CounterPoints


def gpu_count(c: NodeInputs) -> Outcome:
    """GPUs NVML counts against those expected (a GPU counted but lost or stuck is its own
    gpu_answering check's)."""
    s = c.snapshot
    if s.gpu_count < s.expected_gpus:
        return Outcome(FAILED, s.gpu_count, s.expected_gpus, reason="fewer GPUs than expected")
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


@dataclass(frozen=True)
class PortInputs:
    """One InfiniBand/RoCE port's reading, for the checks judged per port."""

    snapshot: Snapshot
    settings: HealthSettings
    counters: CounterPoints
    port: InfinibandPort

    @property
    def name(self) -> str:
        return f"{self.port.device}/{self.port.port}"

    def increase(self, counter: str) -> tuple[float, float] | None | Literal[False]:
        """(increase, seconds) of one of the port's counters over the window; None before
        a second read; False where the port does not count it."""
        p = self.port
        value = p.counters.get(counter, p.hw_counters.get(counter))
        if value is None:
            return False
        key = (None, f"{self.name} {counter}")
        self.counters.observe(key, self.snapshot.time, value, IB_WINDOW_SECONDS)
        return self.counters.increase(key, IB_WINDOW_SECONDS)


def infiniband_ports(c: PortInputs) -> Outcome:
    """DOWN (1) fails; INIT (2) or ARMED (3), up but not activated by the subnet manager,
    warns."""
    state = c.port.state_id
    if state is None:
        return Outcome(UNKNOWN, reason=f"InfiniBand {c.name} state not read")
    if state == 1:
        return Outcome(FAILED, state, 4, reason=f"InfiniBand port {c.name} down")
    if state in (2, 3):
        return Outcome(WARNING, state, 4, reason=f"InfiniBand port {c.name} not active")
    return Outcome(OK, state, 4)


def _any_increase(counter: str, words: str) -> Callable[[PortInputs], Outcome]:
    """Any increase of the counter in the window fails."""
    def judge(c: PortInputs) -> Outcome:
        seen = c.increase(counter)
        if seen is False:
            return Outcome(NOT_APPLICABLE, threshold=0)
        if seen is None:
            return Outcome(UNKNOWN, threshold=0,
                           reason=f"InfiniBand {c.name} error rates not known yet")
        if seen[0] > 0:
            return Outcome(FAILED, seen[0], 0, reason=f"InfiniBand {c.name}: {words}")
        return Outcome(OK, 0.0, 0)
    return judge


def _rate_above(counter: str, per: float, setting: str, words: str
                ) -> Callable[[PortInputs], Outcome]:
    """The counter's rate over the window (a second, or `per` seconds) above the
    setting's warns."""
    def judge(c: PortInputs) -> Outcome:
        limit = getattr(c.settings, setting)
        seen = c.increase(counter)
        if seen is False:
            return Outcome(NOT_APPLICABLE, threshold=limit)
        if seen is None:
            return Outcome(UNKNOWN, threshold=limit,
                           reason=f"InfiniBand {c.name} error rates not known yet")
        rate = seen[0] / seen[1] * per if seen[1] > 0 else 0.0
        if rate > limit:
            return Outcome(WARNING, round(rate, 3), limit,
                           reason=f"InfiniBand {c.name}: {words}")
        return Outcome(OK, round(rate, 3), limit)
    return judge


CHECKS = (
    Check("gpu_count", "NVML's device count against --gpus.expected", gpu_count),
    Check("nvlink_fabric", "NVML nvmlDeviceGetGpuFabricInfoV of every GPU: one cluster, "
          "all registered", nvlink_fabric),
)
# Judged for each port (the `device` and `port` labels of gpu_node_health_check_state),
# NVSentinel's NIC monitor over 5 minutes.
PORT_CHECKS = (
    Check("infiniband_ports", "port state DOWN fails, INIT or ARMED warns", infiniband_ports),
    Check("infiniband_link_downed", "NVSentinel's NIC monitor: any link_downed in 5 minutes "
          "fails", _any_increase("link_downed", "link went down")),
    Check("infiniband_buffer_overrun", "NVSentinel's NIC monitor: any excessive buffer "
          "overrun in 5 minutes fails",
          _any_increase("excessive_buffer_overrun_errors", "excessive buffer overruns")),
    Check("infiniband_link_integrity", "NVSentinel's NIC monitor: any local link integrity "
          "error in 5 minutes fails",
          _any_increase("local_link_integrity_errors", "local link integrity errors")),
    Check("infiniband_rnr_retry", "NVSentinel's NIC monitor: any RNR retry error "
          "(rnr_nak_retry_err) in 5 minutes fails",
          _any_increase("rnr_nak_retry_err", "RNR retries exceeded")),
    Check("infiniband_symbol_errors", "NVSentinel's NIC monitor: symbol errors a second over "
          "5 minutes above the setting warn",
          _rate_above("symbol_error", 1.0, "infiniband_symbol_errors_per_second",
                      "symbol error rate high")),
    Check("infiniband_link_error_recovery", "NVSentinel's NIC monitor: link error "
          "recoveries a minute over 5 minutes above the setting warn",
          _rate_above("link_error_recovery", 60.0, "infiniband_link_error_recovery_per_minute",
                      "link error recoveries high")),
)
