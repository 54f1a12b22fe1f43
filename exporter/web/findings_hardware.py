"""Hardware findings: XIDs, ECC, retired pages, row remapping, the recovery action, NVLink,
lost, hung or missing GPUs, and clock events. Pure: Snapshot -> finding dicts.

Severities follow the alerts in alerts/gpu-hardware.yml, so the page and Prometheus do
not disagree about what is urgent. Counters here are totals (since the driver loaded, or
over the GPU's life); where the health checks judged their rate (NVLink errors, by DCGM's
thresholds: exporter/health/), the finding takes the check's severity, so 18,000 CRC
errors a second read critical, not information.
"""

from __future__ import annotations

from typing import Any

from exporter.gpu.fields import CLOCK_EVENT_REASONS
from exporter.gpu.xid import MEANINGS, xid_class
from exporter.health.model import CheckResult, NodeHealth
from exporter.health.settings import HealthSettings
from exporter.sampling.snapshot import Snapshot
from exporter.web.wording import CRITICAL, INFO, WARNING, ago, duration, finding, percent

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
_XID_SEVERITY = {"critical": CRITICAL, "warning": WARNING}


# a health check's state -> the finding's severity
CHECK_SEVERITY = {"failed": CRITICAL, "warning": WARNING}


def hardware_findings(snapshot: Snapshot, health: NodeHealth | None = None
                      ) -> list[dict[str, Any]]:
    return [*_gpu_presence(snapshot), *_xids(snapshot), *_memory(snapshot, health),
            *_nvlink(snapshot, health), *_clock_events(snapshot)]


def _check(health: NodeHealth | None, gpu: int, name: str) -> CheckResult | None:
    verdict = health.gpus.get(gpu) if health is not None else None
    if verdict is None:
        return None
    return next((c for c in verdict.checks if c.name == name), None)


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


def _xids(snap: Snapshot) -> list[dict[str, Any]]:
    out = []
    for (gpu, code), record in sorted(snap.xids.items()):
        klass = xid_class(code)
        meaning = MEANINGS.get(code, "see NVIDIA's XID catalog")
        times = "once" if record.count == 1 else f"{record.count} times"
        out.append(finding("xid", _XID_SEVERITY.get(klass, INFO),
                           f"GPU {gpu}: XID {code} ({meaning}), {klass}, {times}, last "
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
    for gpu, h in sorted(snap.health.items()):
        uncorrected = h.ecc_errors.get(("uncorrected", "volatile"))
        if uncorrected:
            out.append(finding("ecc", CRITICAL,
                               f"GPU {gpu} has {uncorrected:.0f} uncorrected ECC "
                               f"error{'s' if uncorrected != 1 else ''} since the driver "
                               "loaded", h.time, gpu=gpu,
                               ecc_errors={f"{t}_{s}": v for (t, s), v in h.ecc_errors.items()}))
        if h.row_remap_failure:
            out.append(finding("row_remap", CRITICAL,
                               f"GPU {gpu}: a row remap failed; the GPU needs replacing",
                               h.time, gpu=gpu, remapped_rows=dict(h.remapped_rows)))
        elif h.row_remap_pending:
            out.append(finding("row_remap", WARNING,
                               f"GPU {gpu}: a row remap waits for the next GPU reset",
                               h.time, gpu=gpu, remapped_rows=dict(h.remapped_rows)))
        retired = sum(h.retired_pages.values())
        if retired >= _retired_pages_limit(health, gpu) or h.retired_pages_pending:
            pending = ", one waits for the next reset" if h.retired_pages_pending else ""
            out.append(finding("retired_pages", WARNING,
                               f"GPU {gpu} has {retired:.0f} retired memory pages{pending}",
                               h.time, gpu=gpu, retired_pages=dict(h.retired_pages)))
        if h.recovery_action not in (None, "none"):
            out.append(finding("recovery_action", CRITICAL,
                               f"GPU {gpu}: NVML asks for recovery: {h.recovery_action}",
                               h.time, gpu=gpu, action=h.recovery_action))
    return out


def _nvlink(snap: Snapshot, health: NodeHealth | None = None) -> list[dict[str, Any]]:
    out = []
    for gpu, h in sorted(snap.health.items()):
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
            severity = CHECK_SEVERITY.get(check.state, INFO) if check else INFO
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
