"""Hardware findings: XIDs, ECC, retired pages, row remapping, the recovery action, NVLink,
lost, hung or missing GPUs, and clock events. Pure: a snapshot and its verdict -> finding
dicts.

Severities come from the health verdict (exporter/health/), the one judge, and from
nothing else: each finding takes the state of the checks that judged what it reports,
in the one severity vocabulary (failed -> critical, warning -> warning, anything else,
unknown included, information: wording.severity_of), and says the check, its state, the
action it asks for (in model.ACTION_WORDS' words) and its reason in `details.verdict`.
The page keeps no severity of its own: where the verdict is `unknown` (nothing judged
yet), so is every finding information. Counters are totals (since the driver loaded, or
over the GPU's life); the checks judge their rates, so 18,000 CRC errors a second read
critical, not information.
"""

from __future__ import annotations

import functools
from typing import Any

from exporter.gpu.fields import CLOCK_EVENT_REASONS
from exporter.gpu.xid import meaning, xid_class
from exporter.health.faults import xid_judgement
from exporter.health.model import (
    NONE,
    UNKNOWN,
    CheckResult,
    NodeHealth,
    Verdict,
    action_words,
    state_rank,
)
from exporter.sampling.snapshot import Snapshot
from exporter.web.wording import (
    INFO,
    SEVERITIES,
    ago,
    duration,
    finding,
    percent,
    severity_of,
)

# Clock-event reasons that slow a busy GPU down, as the metrics and the straggler
# window's throttle_reasons name them -> (words, the checks that judge them). The
# severity is those checks' (none: information). sw_power_cap holds the clocks at the
# top of every training step on a capped node, which is normal and judged by no check:
# it is reported only when it held for most of the window.
SLOWDOWNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "hw_slowdown": ("HW slowdown", ("thermal_violation", "power_violation")),
    "hw_thermal_slowdown": ("HW thermal slowdown", ("thermal_violation",)),
    "hw_power_brake_slowdown": ("HW power brake", ("power_violation",)),
    "sw_thermal_slowdown": ("SW thermal slowdown", ("thermal_violation",)),
    "sw_power_cap": ("its power cap", ()),
}
POWER_CAP_MIN_SHARE = 0.5


def hardware_findings(snapshot: Snapshot, verdict: NodeHealth) -> list[dict[str, Any]]:
    return [*_gpu_presence(snapshot, verdict), *_xids(snapshot, verdict),
            *_memory(snapshot, verdict), *_nvlink(snapshot, verdict),
            *_clock_events(snapshot, verdict)]


def _checks(verdict: Verdict | None, names: tuple[str, ...]) -> list[CheckResult]:
    if verdict is None:
        return []
    return [c for c in verdict.checks if c.name in names]


def _judged(verdict: Verdict | None, *names: str) -> CheckResult | None:
    """The worst of the named checks in a verdict (the first of equals), or None where the
    verdict has none of them (nothing judged it: unknown)."""
    found = _checks(verdict, names)
    return functools.reduce(lambda a, b: a if state_rank(a.state) >= state_rank(b.state)
                            else b, found) if found else None


def _gpu(health: NodeHealth, gpu: int) -> Verdict | None:
    return health.gpus.get(gpu)


def _severity(check: CheckResult | None) -> str:
    return severity_of(check.state if check is not None else UNKNOWN)


def _said(check: CheckResult | None) -> dict[str, Any]:
    """What the verdict says of a finding: its check, state, action (the token and its
    words) and reason; unknown where no check judged it."""
    if check is None:
        return {"check": None, "state": UNKNOWN, "action": NONE,
                "action_words": action_words(NONE), "reason": ""}
    return {"check": check.name, "state": check.state, "action": check.action,
            "action_words": action_words(check.action), "reason": check.reason}


def _judged_finding(kind: str, check: CheckResult | None, message: str, time: float,
                    **details: Any) -> dict[str, Any]:
    """A finding with the verdict's severity and words: the action it asks for, where it
    asks one, ends the message."""
    if check is not None and check.action != NONE and severity_of(check.state) != INFO:
        message = f"{message}: {action_words(check.action)}"
    return finding(kind, _severity(check), message, time, verdict=_said(check), **details)


def _milder(a: str, b: str) -> str:
    return a if SEVERITIES.index(a) >= SEVERITIES.index(b) else b


def _gpu_presence(snap: Snapshot, health: NodeHealth) -> list[dict[str, Any]]:
    out = []
    for gpu, since in sorted(snap.hung.items()):
        out.append(_judged_finding(
            "gpu_hung", _judged(_gpu(health, gpu), "gpu_answering"),
            f"GPU {gpu} is stuck in an NVML call for {duration(snap.time - since)}; its data "
            "is left out", snap.time, gpu=gpu, since=since, hangs=snap.hangs.get(gpu, 0)))
    for gpu in sorted(snap.lost):
        out.append(_judged_finding(
            "gpu_lost", _judged(_gpu(health, gpu), "gpu_answering"),
            f"GPU {gpu} is lost (NVML: GPU is lost); retried every few seconds", snap.time,
            gpu=gpu, recovery_attempts=snap.recovery_attempts.get(gpu, 0)))
    if snap.gpu_count < snap.expected_gpus:
        out.append(_judged_finding(
            "gpus_missing", _judged(health.node, "gpu_count"),
            f"{snap.gpu_count} GPUs present, {snap.expected_gpus} expected", snap.time,
            present=snap.gpu_count, expected=snap.expected_gpus))
    return out


def _xids(snap: Snapshot, health: NodeHealth) -> list[dict[str, Any]]:
    """Each XID at the state the verdict's `xid` check gives the GPU now, never above the
    severity the fault table gives that code (`xid_judgement`, the one reading of an XID):
    an XID past the check's hold window is information, and so is an XID the table calls
    harmless beside one that failed the GPU."""
    out = []
    for (gpu, code), record in sorted(snap.xids.items()):
        klass = xid_class(code)
        check = _judged(_gpu(health, gpu), "xid")
        severity = _milder(xid_judgement(code).severity, _severity(check))
        times = "once" if record.count == 1 else f"{record.count} times"
        message = (f"GPU {gpu}: XID {code} ({meaning(code)}), {klass}, {times}, last "
                   f"{ago(snap.time, record.last_seen)}")
        # the check's action is the code it judged by (its value)'s: said with that code
        if check is not None and check.value == code and check.action != NONE \
                and severity != INFO:
            message += f": {action_words(check.action)}"
        out.append(finding("xid", severity, message, record.last_seen, gpu=gpu, xid=code,
                           xid_class=klass, count=record.count, verdict=_said(check)))
    return out


def _memory(snap: Snapshot, health: NodeHealth) -> list[dict[str, Any]]:
    out = []
    for gpu, h in sorted(snap.device_reads.items()):
        verdict = _gpu(health, gpu)
        uncorrected = h.ecc_errors.get(("uncorrected", "volatile"))
        if uncorrected:
            out.append(_judged_finding(
                "ecc", _judged(verdict, "ecc_uncorrected"),
                f"GPU {gpu} has {uncorrected:.0f} uncorrected ECC "
                f"error{'s' if uncorrected != 1 else ''} since the driver loaded", h.time,
                gpu=gpu, ecc_errors={f"{t}_{s}": v for (t, s), v in h.ecc_errors.items()}))
        if h.row_remap_failure:
            out.append(_judged_finding(
                "row_remap", _judged(verdict, "row_remap_failure"),
                f"GPU {gpu}: a row remap failed; the GPU needs replacing", h.time, gpu=gpu,
                remapped_rows=dict(h.remapped_rows)))
        elif h.row_remap_pending:
            out.append(_judged_finding(
                "row_remap", _judged(verdict, "row_remap_pending"),
                f"GPU {gpu}: a row remap waits for the next GPU reset", h.time, gpu=gpu,
                remapped_rows=dict(h.remapped_rows)))
        retired = sum(h.retired_pages.values())
        pages = _judged(verdict, "retired_pages", "retired_pages_recent",
                        "retired_pages_pending")
        if _retired_past_limit(verdict, retired) or h.retired_pages_pending:
            pending = ", one waits for the next reset" if h.retired_pages_pending else ""
            out.append(_judged_finding(
                "retired_pages", pages,
                f"GPU {gpu} has {retired:.0f} retired memory pages{pending}", h.time,
                gpu=gpu, retired_pages=dict(h.retired_pages)))
        if h.recovery_action not in (None, "none"):
            check = _judged(verdict, "recovery_action")
            # the verdict's reason says what the driver asks for, in the action's words
            said = check.reason if check is not None and check.reason else (
                f"the driver's recovery action is {h.recovery_action}")
            out.append(finding("recovery_action", _severity(check), f"GPU {gpu}: {said}",
                               h.time, gpu=gpu, verdict=_said(check),
                               action=check.action if check is not None else NONE,
                               driver_action=h.recovery_action))
    return out


def _retired_past_limit(verdict: Verdict | None, retired: float) -> bool:
    """Whether the retired pages reach the limit the verdict's check judged with (so the
    page moves with the setting); no limit where no check judged them."""
    check = _judged(verdict, "retired_pages")
    limit = check.threshold if check is not None else None
    return isinstance(limit, float | int) and retired >= float(limit)


def _nvlink(snap: Snapshot, health: NodeHealth) -> list[dict[str, Any]]:
    out = []
    for gpu, h in sorted(snap.device_reads.items()):
        verdict = _gpu(health, gpu)
        ident = snap.identities[gpu] if gpu < len(snap.identities) else None
        down = [link.link for link in h.nvlinks if link.up is False]
        if down and ident is not None and ident.nvlinks:
            out.append(_judged_finding(
                "nvlink", _judged(verdict, "nvlink_links"),
                f"GPU {gpu}: {len(down)} of {ident.nvlinks} NVLinks down (links "
                f"{', '.join(map(str, down[:8]))}{', ...' if len(down) > 8 else ''})",
                h.time, gpu=gpu, links_down=down, links_expected=ident.nvlinks))
        totals: dict[str, float] = {}
        for link in h.nvlinks:
            for kind, value in link.errors.items():
                totals[kind] = totals.get(kind, 0.0) + value
        errors = {k: v for k, v in sorted(totals.items()) if v}
        if errors:
            text = ", ".join(f"{v:.0f} {k.replace('_', ' ')}" for k, v in errors.items())
            # CRC errors and replay/recovery errors are two checks: the worse one judges
            # (details.verdict.check names it)
            check = _judged(verdict, "nvlink_errors", "nvlink_replays")
            judged = (f"{check.reason} ({check.value:g} against {check.threshold:g}); "
                      if check is not None and _severity(check) != INFO
                      and isinstance(check.value, float | int)
                      and isinstance(check.threshold, float | int) else "")
            out.append(_judged_finding(
                "nvlink", check, f"GPU {gpu}: {judged}NVLink errors since the driver "
                f"loaded: {text}", h.time, gpu=gpu, errors=errors))
    return out


def _clock_events(snap: Snapshot, health: NodeHealth) -> list[dict[str, Any]]:
    """One finding per GPU with slowdowns active now or held over the straggler window
    (their share of it); reasons that come together (a power brake is also an HW
    slowdown) share one sentence, at the worst state of the checks that judge them."""
    analysis = snap.straggler_analysis
    features = analysis.features if analysis is not None else None
    span = features.t_end - features.t_start if features is not None else 0.0
    out = []
    for gpu, reading in sorted(snap.readings.items()):
        bits = reading.get("clock_event_reasons")
        window = features.gpus.get(gpu) if features is not None else None
        shares = window.throttle_reasons if window is not None else {}
        parts, reasons = [], {}
        judging: set[str] = set()
        for reason, (words, checks) in SLOWDOWNS.items():
            active = bits is not None and bool(int(bits) & CLOCK_EVENT_REASONS[reason])
            share = shares.get(reason)
            if not checks and (share is None or share < POWER_CAP_MIN_SHARE):
                continue
            if checks and not active and not share:
                continue
            judging.update(checks)
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
            check = _judged(_gpu(health, gpu), *sorted(judging))
            out.append(_judged_finding(
                "clock_event", check, f"GPU {gpu} clocks held down by {', '.join(parts)}",
                reading.time, gpu=gpu, reasons=reasons))
    return out
