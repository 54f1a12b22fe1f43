"""Hardware findings: XIDs, ECC, retired pages, row remapping, the recovery action, NVLink,
lost, hung or missing GPUs, and clock events. Pure: Snapshot -> finding dicts.

Severities come from the health verdict (exporter/health/), the one judge: where a check
judged what a finding reports (XIDs, ECC, retired pages, row remapping, the recovery
action, NVLink errors), the finding takes that check's state in the one severity
vocabulary (failed -> critical, warning -> warning, else info: wording.severity_of). Where
no verdict is at hand (a test, the first snapshot) the XID table's state, or the
constant named here, stands in. Counters are totals (since the driver loaded, or over
the GPU's life); the checks judge their rates, so 18,000 CRC errors a second read
critical, not information.
"""

from __future__ import annotations

import functools
from typing import Any

from exporter.gpu.fields import CLOCK_EVENT_REASONS
from exporter.gpu.xid import meaning, xid_class, xid_row
from exporter.health.checks_gpu import DRIVER_ONLY, RECOVERY
from exporter.health.model import CheckResult, NodeHealth, action_words, worse
from exporter.health.settings import HealthSettings
from exporter.sampling.snapshot import Snapshot
from exporter.web.wording import (
    CRITICAL,
    INFO,
    SEVERITIES,
    WARNING,
    ago,
    duration,
    finding,
    percent,
    severity_of,
)

# GpuRetiredPagesHigh: at 64 retired pages a GPU cannot retire more. The health check's
# limit (health_retired_pages_max, 63): the verdict's where it judged the GPU, else the
# setting's default.
RETIRED_PAGES_DEFAULT = HealthSettings().retired_pages_max
# Clock-event reasons that slow a busy GPU down, as the metrics and the straggler
# window's throttle_reasons name them -> (words, severity). sw_power_cap holds the clocks
# at the top of every training step on a capped node, which is normal: it is reported
# only when it held for most of the window.
SLOWDOWNS = {
    "hw_slowdown": ("HW slowdown", WARNING),
    "hw_thermal_slowdown": ("HW thermal slowdown", WARNING),
    "hw_power_brake_slowdown": ("HW power brake", WARNING),
    "sw_thermal_slowdown": ("SW thermal slowdown", WARNING),
    "sw_power_cap": ("its power cap", INFO),
}
POWER_CAP_MIN_SHARE = 0.5


def hardware_findings(snapshot: Snapshot, health: NodeHealth | None = None
                      ) -> list[dict[str, Any]]:
    return [*_gpu_presence(snapshot), *_xids(snapshot, health), *_memory(snapshot, health),
            *_nvlink(snapshot, health), *_clock_events(snapshot)]


def _check(health: NodeHealth | None, gpu: int, name: str) -> CheckResult | None:
    verdict = health.gpus.get(gpu) if health is not None else None
    if verdict is None:
        return None
    return next((c for c in verdict.checks if c.name == name), None)


def _judged(health: NodeHealth | None, gpu: int, *names: str) -> str | None:
    """The worst state of the named checks in this GPU's verdict, or None where the
    verdict has none of them."""
    checks = (_check(health, gpu, name) for name in names)
    states = [c.state for c in checks if c is not None]
    return functools.reduce(worse, states) if states else None


def _severity(health: NodeHealth | None, gpu: int, fallback: str, *checks: str) -> str:
    """The verdict's severity for what these checks judge, else `fallback`."""
    state = _judged(health, gpu, *checks)
    return fallback if state is None else severity_of(state)


def _milder(a: str, b: str) -> str:
    return a if SEVERITIES.index(a) >= SEVERITIES.index(b) else b


def _gpu_presence(snap: Snapshot) -> list[dict[str, Any]]:
    out = []
    for gpu, since in sorted(snap.hung.items()):
        out.append(finding("gpu_hung", CRITICAL,
                           f"GPU {gpu} is stuck in an NVML call for "
                           f"{duration(snap.time - since)}; its data is left out",
                           snap.time, gpu=gpu, since=since, hangs=snap.hangs.get(gpu, 0)))
    for gpu in sorted(snap.lost):
        out.append(finding("gpu_lost", CRITICAL,
                           f"GPU {gpu} is lost (NVML: GPU is lost); retried every few seconds",
                           snap.time, gpu=gpu,
                           recovery_attempts=snap.recovery_attempts.get(gpu, 0)))
    if snap.gpu_count < snap.expected_gpus:
        out.append(finding("gpus_missing", CRITICAL,
                           f"{snap.gpu_count} GPUs present, {snap.expected_gpus} expected",
                           snap.time, present=snap.gpu_count, expected=snap.expected_gpus))
    return out


def _xids(snap: Snapshot, health: NodeHealth | None) -> list[dict[str, Any]]:
    """Each XID at the state its table row puts the GPU in, never above what the verdict's
    `xid` check says now (an XID past the check's hold window is information)."""
    out = []
    for (gpu, code), record in sorted(snap.xids.items()):
        klass = xid_class(code)
        severity = severity_of(xid_row(code).state)
        judged = _judged(health, gpu, "xid")
        if judged is not None:
            severity = _milder(severity, severity_of(judged))
        times = "once" if record.count == 1 else f"{record.count} times"
        out.append(finding("xid", severity,
                           f"GPU {gpu}: XID {code} ({meaning(code)}), {klass}, {times}, last "
                           f"{ago(snap.time, record.last_seen)}",
                           record.last_seen, gpu=gpu, xid=code, xid_class=klass,
                           count=record.count))
    return out


def _retired_pages_limit(health: NodeHealth | None, gpu: int) -> float:
    """The retired pages at which the health check fails this GPU: the limit it judged
    with, so that the page moves with the setting."""
    check = _check(health, gpu, "retired_pages")
    if check is not None and isinstance(check.threshold, float | int):
        return float(check.threshold)
    return RETIRED_PAGES_DEFAULT


def _memory(snap: Snapshot, health: NodeHealth | None = None) -> list[dict[str, Any]]:
    out = []
    for gpu, h in sorted(snap.device_reads.items()):
        uncorrected = h.ecc_errors.get(("uncorrected", "volatile"))
        if uncorrected:
            out.append(finding("ecc", _severity(health, gpu, CRITICAL, "ecc_uncorrected"),
                               f"GPU {gpu} has {uncorrected:.0f} uncorrected ECC "
                               f"error{'s' if uncorrected != 1 else ''} since the driver "
                               "loaded", h.time, gpu=gpu,
                               ecc_errors={f"{t}_{s}": v for (t, s), v in h.ecc_errors.items()}))
        if h.row_remap_failure:
            out.append(finding("row_remap", _severity(health, gpu, CRITICAL,
                                                      "row_remap_failure"),
                               f"GPU {gpu}: a row remap failed; the GPU needs replacing",
                               h.time, gpu=gpu, remapped_rows=dict(h.remapped_rows)))
        elif h.row_remap_pending:
            out.append(finding("row_remap", _severity(health, gpu, WARNING,
                                                      "row_remap_pending"),
                               f"GPU {gpu}: a row remap waits for the next GPU reset",
                               h.time, gpu=gpu, remapped_rows=dict(h.remapped_rows)))
        retired = sum(h.retired_pages.values())
        if retired >= _retired_pages_limit(health, gpu) or h.retired_pages_pending:
            pending = ", one waits for the next reset" if h.retired_pages_pending else ""
            out.append(finding("retired_pages",
                               _severity(health, gpu, CRITICAL, "retired_pages",
                                         "retired_pages_recent", "retired_pages_pending"),
                               f"GPU {gpu} has {retired:.0f} retired memory pages{pending}",
                               h.time, gpu=gpu, retired_pages=dict(h.retired_pages)))
        if h.recovery_action not in (None, "none"):
            state, action = RECOVERY.get(h.recovery_action, ("warning", "none"))
            asks = action_words(action) if action != "none" else DRIVER_ONLY.get(
                h.recovery_action, f"recover ({h.recovery_action})")
            out.append(finding("recovery_action",
                               _severity(health, gpu, severity_of(state), "recovery_action"),
                               f"GPU {gpu}: the driver asks to {asks}", h.time, gpu=gpu,
                               action=action, driver_action=h.recovery_action))
    return out


def _nvlink(snap: Snapshot, health: NodeHealth | None = None) -> list[dict[str, Any]]:
    out = []
    for gpu, h in sorted(snap.device_reads.items()):
        ident = snap.identities[gpu] if gpu < len(snap.identities) else None
        down = [link.link for link in h.nvlinks if link.up is False]
        if down and ident is not None and ident.nvlinks:
            out.append(finding("nvlink", CRITICAL,
                               f"GPU {gpu}: {len(down)} of {ident.nvlinks} NVLinks down "
                               f"(links {', '.join(map(str, down[:8]))}"
                               f"{', ...' if len(down) > 8 else ''})",
                               h.time, gpu=gpu, links_down=down, links_expected=ident.nvlinks))
        totals: dict[str, float] = {}
        for link in h.nvlinks:
            for kind, value in link.errors.items():
                totals[kind] = totals.get(kind, 0.0) + value
        errors = {k: v for k, v in sorted(totals.items()) if v}
        if errors:
            text = ", ".join(f"{v:.0f} {k.replace('_', ' ')}" for k, v in errors.items())
            check = _check(health, gpu, "nvlink_errors")
            severity = severity_of(check.state) if check else INFO
            judged = (f"{check.reason} ({check.value:g} against {check.threshold:g}); "
                      if check is not None and severity != INFO
                      and isinstance(check.value, float | int)
                      and isinstance(check.threshold, float | int) else "")
            out.append(finding("nvlink", severity,
                               f"GPU {gpu}: {judged}NVLink errors since the driver loaded: "
                               f"{text}", h.time, gpu=gpu, errors=errors))
    return out


def _clock_events(snap: Snapshot) -> list[dict[str, Any]]:
    """One finding per GPU with slowdowns active now or held over the straggler window
    (their share of it); reasons that come together (a power brake is also an HW
    slowdown) share one sentence."""
    analysis = snap.straggler_analysis
    features = analysis.features if analysis is not None else None
    span = features.t_end - features.t_start if features is not None else 0.0
    out = []
    for gpu, state in sorted(snap.states.items()):
        bits = state.get("clock_event_reasons")
        window = features.gpus.get(gpu) if features is not None else None
        shares = window.throttle_reasons if window is not None else {}
        parts, reasons, severity = [], {}, INFO
        for reason, (words, level) in SLOWDOWNS.items():
            active = bits is not None and bool(int(bits) & CLOCK_EVENT_REASONS[reason])
            share = shares.get(reason)
            if level == INFO and (share is None or share < POWER_CAP_MIN_SHARE):
                continue
            if level != INFO and not active and not share:
                continue
            severity = WARNING if level == WARNING else severity
            total = snap.clock_event_seconds.get((gpu, reason))
            said = ["active now" if active else "not active now"]
            if share is not None and features is not None:
                said.append(f"{percent(share)} of the last {duration(span)}")
            if total:
                said.append(f"{duration(total)} in all")
            parts.append(f"{words} ({'; '.join(said)})")
            reasons[reason] = {"active": active,
                               "window_share": None if share is None else round(share, 3),
                               "seconds_total": None if total is None else round(total, 1)}
        if parts:
            out.append(finding("clock_event", severity,
                               f"GPU {gpu} clocks held down by {', '.join(parts)}",
                               state.time, gpu=gpu, reasons=reasons))
    return out
