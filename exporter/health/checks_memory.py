"""Memory checks (DCGM 4.x's memory health watch, DcgmHealthWatch.cpp, with the limits of
common/DcgmGPUHardwareLimits.h): ECC, retired pages, row remapping."""

from __future__ import annotations

from exporter.health.context import Check, GpuInputs
from exporter.health.model import (
    FAILED,
    NOT_APPLICABLE,
    OK,
    UNKNOWN,
    WARNING,
    Outcome,
)

DCGM = "DCGM 4.x memory health watch"
WEEK = 7 * 86400.0


def ecc_uncorrected(c: GpuInputs) -> Outcome:
    h = c.device_read
    if h is None:
        return Outcome(UNKNOWN, reason="memory not read")
    value = h.ecc_errors.get(("uncorrected", "volatile"))
    if value is None:
        return Outcome(NOT_APPLICABLE, threshold=0)
    if value > 0:
        return Outcome(FAILED, value, 0, reason="uncorrectable ECC errors")
    return Outcome(OK, value, 0)


def retired_pages(c: GpuInputs) -> Outcome:
    h = c.device_read
    limit = c.settings.retired_pages_max
    if h is None:
        return Outcome(UNKNOWN, reason="memory not read")
    if not h.retired_pages:  # Hopper and newer remap rows instead
        return Outcome(NOT_APPLICABLE, threshold=limit)
    total = sum(h.retired_pages.values())
    if total >= limit:
        return Outcome(FAILED, total, limit, reason="too many retired pages")
    return Outcome(OK, total, limit)


def retired_pages_recent(c: GpuInputs) -> Outcome:
    """More than `retired_dbe_pages_max` double-bit pages and more than one new in a
    week. The week is what this process has seen (the exporter keeps no older points)."""
    h = c.device_read
    s = c.settings
    if h is None:
        return Outcome(UNKNOWN, reason="memory not read")
    dbe = h.retired_pages.get("double_bit")
    if dbe is None:
        return Outcome(NOT_APPLICABLE, threshold=s.retired_dbe_pages_max)
    seen = c.increase("retired_dbe", h.time, dbe, WEEK, changes_only=True)
    new = seen[0] if seen is not None else 0.0
    if dbe > s.retired_dbe_pages_max and new > s.retired_dbe_new_pages_per_week:
        return Outcome(FAILED, dbe, s.retired_dbe_pages_max,
                       reason="double-bit page retirements growing")
    return Outcome(OK, dbe, s.retired_dbe_pages_max)


def retired_pages_pending(c: GpuInputs) -> Outcome:
    h = c.device_read
    if h is None:
        return Outcome(UNKNOWN, reason="memory not read")
    if h.retired_pages_pending is None:
        return Outcome(NOT_APPLICABLE, threshold=0)
    if h.retired_pages_pending > 0:
        return Outcome(WARNING, h.retired_pages_pending, 0,
                       reason="page retirement pending (reset the GPU)")
    return Outcome(OK, 0, 0)


def row_remap_failure(c: GpuInputs) -> Outcome:
    h = c.device_read
    if h is None:
        return Outcome(UNKNOWN, reason="memory not read")
    if h.row_remap_failure is None:
        return Outcome(NOT_APPLICABLE, threshold=0)
    if h.row_remap_failure > 0:
        return Outcome(FAILED, h.row_remap_failure, 0, reason="row remap failed")
    return Outcome(OK, 0, 0)


def row_remap_pending(c: GpuInputs) -> Outcome:
    h = c.device_read
    if h is None:
        return Outcome(UNKNOWN, reason="memory not read")
    if h.row_remap_pending is None:
        return Outcome(NOT_APPLICABLE, threshold=0)
    if h.row_remap_pending > 0:
        return Outcome(WARNING, h.row_remap_pending, 0,
                       reason="row remap pending (reset the GPU)")
    return Outcome(OK, 0, 0)


def remapped_rows(c: GpuInputs) -> Outcome:
    h = c.device_read
    limit = c.settings.remapped_rows_uncorrectable_max
    if h is None:
        return Outcome(UNKNOWN, reason="memory not read")
    rows = h.remapped_rows.get("uncorrectable")
    if rows is None:
        return Outcome(NOT_APPLICABLE, threshold=limit)
    if rows >= limit:
        # the bank's spare rows run out: plan a service, nothing to do now
        return Outcome(WARNING, rows, limit, reason="many rows remapped for uncorrectable errors")
    return Outcome(OK, rows, limit)


CHECKS = (
    Check("ecc_uncorrected", DCGM + ": volatile DBE > 0 fails", ecc_uncorrected),
    Check("retired_pages", DCGM + ": SBE + DBE retired pages >= 63 fails", retired_pages),
    Check("retired_pages_recent", DCGM + ": DBE pages > 15 and > 1 new in a week fails",
          retired_pages_recent),
    Check("retired_pages_pending", DCGM + ": pending retirement needs a GPU reset",
          retired_pages_pending),
    Check("row_remap_failure", DCGM + ": a row remap failure fails", row_remap_failure),
    Check("row_remap_pending", "NVML: a pending remap is applied at the next GPU reset",
          row_remap_pending),
    Check("remapped_rows", DCGM + ": uncorrectable remapped rows >= 512 warns",
          remapped_rows),
)
