"""Link and board checks: PCIe, NVLink, thermal and power violations (DCGM 4.x health
watches, DcgmHealthWatch.cpp, with the limits of common/DcgmGPUHardwareLimits.h; counter
rules compare the change over the last minute)."""

from __future__ import annotations

import math

from exporter.gpu.fields import CLOCK_EVENT_REASONS
from exporter.health.context import Check, GpuInputs
from exporter.health.model import (
    FAILED,
    NOT_APPLICABLE,
    OK,
    UNKNOWN,
    WARNING,
    Outcome,
)

DCGM = "DCGM 4.x health watch"


def pcie_replay_limit(generation: float, lanes: float, gen1_rate: float) -> float:
    """ceil(per-lane rate x lanes) per minute; the per-lane rate doubles each generation
    (0.15, 0.3, 0.48 ... as DCGM's table: Gen3 is 0.48, not 0.6)."""
    per_lane = {1: 0.15, 2: 0.3, 3: 0.48, 4: 0.96, 5: 1.92, 6: 3.84}.get(int(generation))
    if per_lane is None:
        per_lane = 0.15 * 2 ** (int(generation) - 1)
    return float(math.ceil(per_lane * gen1_rate / 0.15 * lanes - 1e-9))


def pcie_replays(c: GpuInputs) -> Outcome:
    s = c.reading
    if s is None:
        return Outcome(UNKNOWN, reason="PCIe not read")
    replays, gen, width = (s.get("pcie_replays"), c.value("pcie_max_generation"),
                           c.value("pcie_max_width"))
    if replays is None or gen is None or width is None:
        return Outcome(NOT_APPLICABLE)
    gen = s.get("pcie_generation") or gen
    width = s.get("pcie_width") or width
    limit = pcie_replay_limit(gen, width, c.settings.pcie_replays_per_lane_per_minute)
    seen = c.increase("pcie_replays", s.time, replays)
    if seen is None:
        return Outcome(UNKNOWN, threshold=limit, reason="PCIe replay rate not known yet")
    if seen[0] > limit:
        return Outcome(WARNING, seen[0], limit, reason="PCIe replays above the limit")
    return Outcome(OK, seen[0], limit)


def _pcie_link(c: GpuInputs, key: str, top_key: str, reason: str) -> Outcome:
    """Below its maximum (generation or width) while busy: links slow down at idle. The
    value and threshold name both, as `gen4 x16`."""
    s = c.reading
    if s is None:
        return Outcome(UNKNOWN, reason="PCIe not read")
    gen, width = s.get("pcie_generation"), s.get("pcie_width")
    top_gen, top_width = c.value("pcie_max_generation"), c.value("pcie_max_width")
    if gen is None or width is None or top_gen is None or top_width is None:
        return Outcome(NOT_APPLICABLE)
    value = f"gen{int(gen)} x{int(width)}"
    threshold = f"gen{int(top_gen)} x{int(top_width)}"
    busy = s.get("utilization_gpu_ratio")
    if busy is None or busy <= c.settings.pcie_load_ratio:
        return Outcome(OK, value, threshold)  # idle: a slower link is by design
    current, top = s.get(key), c.value(top_key)
    if current is not None and top is not None and current < top:
        return Outcome(WARNING, value, threshold, reason=reason)
    return Outcome(OK, value, threshold)


def pcie_link(c: GpuInputs) -> Outcome:
    return _pcie_link(c, "pcie_generation", "pcie_max_generation",
                      "PCIe link below its maximum generation")


def pcie_link_width(c: GpuInputs) -> Outcome:
    return _pcie_link(c, "pcie_width", "pcie_max_width", "PCIe link below its maximum width")


def _nvlink_totals(c: GpuInputs) -> dict[str, float] | None:
    h = c.device_read
    if h is None or not h.nvlinks:
        return None
    errors = [link.errors for link in h.nvlinks]
    return {"replay": sum(e.get("replay", 0.0) + e.get("recovery", 0.0) for e in errors),
            "crc": sum(e.get("crc_flit", 0.0) + e.get("crc_data", 0.0) for e in errors)}


def _nvlink_rate(c: GpuInputs, kind: str) -> tuple[float, float] | Outcome:
    """(errors, seconds) of one kind summed over the GPU's links, or the outcome that
    says why there is none."""
    if c.device_read is None:
        return Outcome(UNKNOWN, reason="NVLink not read")
    totals = _nvlink_totals(c)
    if totals is None or not any(link.errors for link in c.device_read.nvlinks):
        return Outcome(NOT_APPLICABLE)
    seen = c.increase(f"nvlink_{kind}", c.device_read.time, totals[kind])
    if seen is None:
        return Outcome(UNKNOWN, reason="NVLink error rate not known yet")
    return seen


def nvlink_replays(c: GpuInputs) -> Outcome:
    s = c.settings
    seen = _nvlink_rate(c, "replay")
    if isinstance(seen, Outcome):
        return seen
    if seen[0] >= s.nvlink_replays_per_minute:
        return Outcome(FAILED, seen[0], s.nvlink_replays_per_minute,
                       reason="NVLink replay or recovery errors")
    return Outcome(OK, seen[0], s.nvlink_replays_per_minute)


def nvlink_errors(c: GpuInputs) -> Outcome:
    """CRC errors: at the per-second rate fails, at the per-minute count warns."""
    s = c.settings
    crc = _nvlink_rate(c, "crc")
    if isinstance(crc, Outcome):
        return crc
    per_minute = crc[0] * min(1.0, s.window_seconds / crc[1])
    per_second = crc[0] / crc[1]
    if per_second >= s.nvlink_crc_per_second:
        return Outcome(FAILED, round(per_second, 3), s.nvlink_crc_per_second,
                       reason="NVLink CRC errors at the failure rate")
    if per_minute >= s.nvlink_crc_per_minute:
        return Outcome(WARNING, per_minute, s.nvlink_crc_per_minute,
                       reason="NVLink CRC errors")
    return Outcome(OK, per_minute, s.nvlink_crc_per_minute)


def nvlink_links(c: GpuInputs) -> Outcome:
    h = c.device_read
    if h is None:
        return Outcome(UNKNOWN, reason="NVLink not read")
    states = [link.up for link in h.nvlinks if link.up is not None]
    ident = c.snapshot.identities[c.gpu] if c.gpu < len(c.snapshot.identities) else None
    expected = ident.nvlinks if ident is not None else len(states)
    if not states or not expected:
        return Outcome(NOT_APPLICABLE)
    up = sum(states)
    if up < expected:
        return Outcome(FAILED, up, expected, reason="NVLink down")
    return Outcome(OK, up, expected)


def _violation(c: GpuInputs, key: str, name: str, what: str) -> Outcome:
    s = c.reading
    if s is None:
        return Outcome(UNKNOWN, reason=f"{what} violation time not read")
    total = s.get(key)
    if total is None:
        return Outcome(NOT_APPLICABLE, threshold=0)
    seen = c.increase(name, s.time, total)
    if seen is None:
        return Outcome(UNKNOWN, threshold=0, reason=f"{what} violation rate not known yet")
    if seen[0] > 0:
        return Outcome(WARNING, round(seen[0], 3), 0, reason=f"{what} violation time rising")
    return Outcome(OK, 0.0, 0)


def thermal_violation(c: GpuInputs) -> Outcome:
    return _violation(c, "clock_event_thermal_seconds", "thermal_violation", "thermal")


def power_violation(c: GpuInputs) -> Outcome:
    # the hardware power brake: the software cap (DCGM's power watch counts it too) holds
    # clocks under every power-capped job by design
    return _violation(c, "clock_event_hw_power_brake_slowdown_seconds", "power_violation",
                      "power")


HW_SLOWDOWNS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def hw_slowdown(c: GpuInputs) -> Outcome:
    """A hardware slowdown holding the clocks down now (the sweep's clock-event bits)."""
    s = c.reading
    if s is None:
        return Outcome(UNKNOWN, reason="clock events not read")
    bits = s.get("clock_event_reasons")
    if bits is None:
        return Outcome(NOT_APPLICABLE)
    active = [name for name in HW_SLOWDOWNS if int(bits) & CLOCK_EVENT_REASONS[name]]
    if active:
        return Outcome(WARNING, ",".join(active), None, reason="hardware slowdown")
    return Outcome(OK, "none")


CHECKS = (
    Check("pcie_replays", DCGM + ": replays/min above ceil(per-lane rate x lanes) warns",
          pcie_replays),
    Check("pcie_link", "PCIe link below its maximum generation while busy warns",
          pcie_link),
    Check("pcie_link_width", "PCIe link below its maximum width while busy warns",
          pcie_link_width),
    Check("nvlink_replays", DCGM + ": replay/recovery errors >= 1/min fails", nvlink_replays),
    Check("nvlink_errors", DCGM + ": CRC errors >= 100/s fails, >= 1/min warns",
          nvlink_errors),
    Check("nvlink_links", DCGM + ": a link down that should be up fails", nvlink_links),
    Check("thermal_violation", DCGM + ": thermal violation time rising warns",
          thermal_violation),
    Check("power_violation", DCGM + ": power violation time (HW power brake) rising warns",
          power_violation),
    Check("hw_slowdown", "NVML clock event reasons: HW slowdown, HW thermal slowdown or HW "
          "power brake active warns", hw_slowdown),
)
