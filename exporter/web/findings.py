"""What the exporter concludes now, in words: a published value (a snapshot and its
verdict) -> a list of findings (dicts).

Pure: the published value in, plain JSON-ready dicts out (wording.finding: kind,
severity, gpu, time, since, message, details). /api/v1/findings serves them and the live page lists
them; the metrics say the same things for Prometheus. The most urgent come first
(critical, warning, info), then by kind and GPU.

Power (from snapshot.power_analysis): a held swing, the step period read from the compute
plateaus, a slow cycle, the last ramp.
Stragglers and stalls (snapshot.straggler_analysis): one finding per straggler GPU and
per stall culprit. Hardware (XIDs, memory, NVLink, lost or hung GPUs, clock events):
exporter/web/findings_hardware.py.
"""

from __future__ import annotations

import math
from typing import Any

from exporter.analysis.stalls import StallResult
from exporter.health.monitor import Published
from exporter.sampling.snapshot import Snapshot
from exporter.web.findings_hardware import hardware_findings
from exporter.web.wording import (
    CRITICAL,
    INFO,
    SEVERITIES,
    WARNING,
    duration,
    finding,
    gpu_list,
    number,
    percent,
    watts,
)

# Kinds in the order a person should read them, at equal severity.
KINDS = ("stall", "checkpoint", "gpu_hung", "gpu_lost", "gpus_missing", "straggler", "xid", "ecc",
         "row_remap", "retired_pages", "recovery_action", "nvlink", "clock_event",
         "power_swing", "step_period", "power_cycle", "ramp")

# A ramp is news for a few minutes; after that it is history (counted in the metrics).
RAMP_RECENT_SECONDS = 600.0


def findings(published: Published) -> list[dict[str, Any]]:
    """Every finding a published value supports, most urgent first: its verdict gives
    the severity and the words of what its checks judge (findings_hardware.py)."""
    snapshot = published.snapshot
    out = [*power_findings(snapshot), *straggler_findings(snapshot),
           *hardware_findings(snapshot, published.verdict)]
    order = {kind: i for i, kind in enumerate(KINDS)}
    out.sort(key=lambda f: (SEVERITIES.index(f["severity"]), order.get(f["kind"], len(KINDS)),
                            -1 if f["gpu"] is None else f["gpu"]))
    return out


# -- power --------------------------------------------------------------------------------

def power_findings(snapshot: Snapshot) -> list[dict[str, Any]]:
    """Information, as the node's power alerts are (NodePowerSwingSustained, NodePowerRamp):
    every synchronous training node swings, steps and cycles. What makes a swing a problem
    is the site's limit on the whole cluster's coherent swing, which no node can see: the
    cluster alert judges it (ClusterPowerSwingCoherent, alerts/global-power.yml)."""
    analysis = snapshot.power_analysis
    if analysis is None:
        return []
    out = []
    swing = analysis.window_swing
    if analysis.swinging and swing is not None and swing.node.frequency_hz:
        node = swing.node
        assert node.frequency_hz  # as just checked
        share = (f" ({percent(node.amplitude_ratio)} of the power limits)"
                 if node.amplitude_ratio is not None else "")
        out.append(finding(
            "power_swing", INFO,
            f"Node power swings {watts(node.amplitude_watts)}{share} at "
            f"{node.frequency_hz:.2f} Hz (every {1 / node.frequency_hz:.1f} s), "
            f"{_synchrony(swing.synchrony)}, high {percent(node.duty_cycle)} of the time",
            analysis.time, frequency_hz=number(node.frequency_hz),
            amplitude_watts=number(node.amplitude_watts, 1),
            amplitude_ratio=number(node.amplitude_ratio), synchrony=number(swing.synchrony),
            duty_cycle=number(node.duty_cycle), mean_watts=number(node.mean_watts, 1),
            window_seconds=number(swing.duration_seconds, 1)))
    step = analysis.step_swing
    if step is not None:
        share = (f" ({percent(step.amplitude_ratio)} of the power limits)"
                 if step.amplitude_ratio is not None else "")
        out.append(finding(
            "step_period", INFO,
            f"Step period {1000 * step.period_seconds:.0f} ms ({step.frequency_hz:.2f} Hz) "
            f"from the compute phases' power: a {watts(step.amplitude_watts)} swing{share}, "
            f"{_synchrony(step.synchrony)}, in {percent(step.duty)} of compute",
            analysis.time, period_seconds=number(step.period_seconds, 6),
            frequency_hz=number(step.frequency_hz, 6), confidence=number(step.confidence, 6),
            significance=number(step.significance, 1),
            amplitude_watts=number(step.amplitude_watts, 1),
            amplitude_ratio=number(step.amplitude_ratio), synchrony=number(step.synchrony),
            duty=number(step.duty), grid_relevant=analysis.step_grid_relevant))
    cycle = analysis.cycle
    if cycle is not None:
        share = (f" ({percent(cycle.amplitude_ratio)} of the power limits)"
                 if cycle.amplitude_ratio is not None else "")
        out.append(finding(
            "power_cycle", INFO,
            f"Node power cycles every {cycle.period_seconds:.1f} s: "
            f"{watts(cycle.amplitude_watts)} deep{share}, {_synchrony(cycle.synchrony)}, "
            f"high {percent(cycle.duty_cycle)} of each cycle",
            analysis.time, period_seconds=number(cycle.period_seconds),
            frequency_hz=number(cycle.frequency_hz, 4),
            amplitude_watts=number(cycle.amplitude_watts, 1),
            amplitude_ratio=number(cycle.amplitude_ratio), synchrony=number(cycle.synchrony),
            duty_cycle=number(cycle.duty_cycle), strength=number(cycle.strength)))
    ramp = analysis.last_ramp
    if ramp is not None and snapshot.time - ramp.time <= RAMP_RECENT_SECONDS:
        verb = "rose" if ramp.direction == "rise" else "fell"
        out.append(finding(
            "ramp", INFO,
            f"Node power {verb} {watts(abs(ramp.delta_watts))} in "
            f"{ramp.duration_seconds:.2f} s to a level that held",
            ramp.time, direction=ramp.direction, delta_watts=number(ramp.delta_watts, 1),
            duration_seconds=number(ramp.duration_seconds),
            ramps_total=dict(analysis.ramps_total)))
    return out


def _synchrony(value: float) -> str:
    """Synchrony in words (docs/power.md: 1 in phase, ~1/N independent)."""
    if value >= 0.8:
        return f"all GPUs in step (synchrony {value:.2f})"
    if value >= 0.5:
        return f"GPUs mostly in step (synchrony {value:.2f})"
    return f"GPUs out of step (synchrony {value:.2f})"


# -- stragglers and stalls -------------------------------------------------------------------

def straggler_findings(snapshot: Snapshot) -> list[dict[str, Any]]:
    analysis = snapshot.straggler_analysis
    if analysis is None:
        return []
    out = []
    report = analysis.report
    report_time = report.time if report is not None else snapshot.time
    for gpu, g in sorted(report.gpus.items()) if report is not None else ():
        if not g.straggler or not g.signals:
            continue
        phrases = [_signal_phrase(sig, g.scores[sig]) for sig in g.signals]
        peers = f"its peers in job {g.group}" if g.group and g.group != "unassigned" else (
            "its peers")
        since = g.since if g.since is not None else report_time
        also = f" (also: {', '.join(p.replace('its peers', 'peers') for p in phrases[1:])})" \
            if len(phrases) > 1 else ""
        message = (f"GPU {gpu} is a straggler: {phrases[0].replace('its peers', peers)} "
                   f"for {duration(snapshot.time - since)}{also}")
        out.append(finding(
            "straggler", WARNING, message, report_time, gpu=gpu, since=since,
            group=g.group, signals={sig: _score_details(g.scores[sig]) for sig in g.signals}))
    stall = analysis.stall
    if stall is not None and stall.cause == "checkpoint" and stall.culprit_gpus:
        out.append(_checkpoint_finding(snapshot, stall, analysis.time))
    if stall is not None and stall.stalled:
        for gpu in stall.culprit_gpus:
            waiting = [w for w in stall.waiting_gpus if w != gpu]
            out.append(finding(
                "stall", CRITICAL,
                f"GPU {gpu} holds up the others: {gpu_list(waiting)} "
                f"{'waits' if len(waiting) == 1 else 'wait'} in a collective (busy at low "
                f"power) while it does not ({duration(analysis.culprit_seconds.get(gpu, 0))} "
                "as the culprit since start)",
                analysis.time, gpu=gpu, waiting_gpus=list(waiting),
                groups=list(stall.groups), stalls_total=analysis.stalls_total,
                culprit_seconds=number(analysis.culprit_seconds.get(gpu, 0.0), 1)))
    return out


def _checkpoint_finding(snapshot: Snapshot, stall: StallResult, time: float
                        ) -> dict[str, Any]:
    """A job's first rank writing a checkpoint while the others wait: the stall signature,
    in the job's rhythm, and no fault (analysis.checkpoints)."""
    gpu = stall.culprit_gpus[0]
    account = snapshot.goodput
    lines = account.checkpoints if account is not None else {}
    line = next(iter(lines.values()), None) if len(lines) == 1 else None
    message = (f"{line[0].upper()}{line[1:]}" if line else
               f"GPU {gpu} writes a checkpoint; the others wait") + (
        " (rank 0 in the job's checkpoint rhythm, read from power and utilization: no "
        "stall is counted)")
    return finding("checkpoint", INFO, message, time, gpu=gpu,
                   waiting_gpus=[w for w in stall.waiting_gpus if w != gpu])


def _signal_phrase(signal: str, score: Any) -> str:
    """One signal against the peers' median, in the unit a person thinks in."""
    value, median = score.value, score.median
    if not (math.isfinite(value) and math.isfinite(median)):
        return f"{signal.replace('_', ' ')} {score.direction} against its peers"
    if signal in ("utilization", "duty_cycle", "throttle"):
        what = {"utilization": "utilization", "duty_cycle": "computing",
                "throttle": "throttled"}[signal]
        tail = "" if signal == "utilization" else " of the time"
        return f"{what} {percent(value)}{tail} against {percent(median)} for its peers"
    if signal == "temperature":
        word = "hotter" if value > median else "cooler"
        return f"{abs(value - median):.0f} °C {word} than its peers"
    name = {"sm_clock": "SM clock", "power": "power", "nvlink": "NVLink traffic",
            "pcie": "PCIe traffic"}.get(signal, signal)
    if median == 0:
        return f"{name} {score.direction} against its peers"
    word = "below" if value < median else "above"
    return f"{name} {abs(value - median) / abs(median) * 100:.0f} % {word} its peers"


def _score_details(score: Any) -> dict[str, Any]:
    return {"value": number(score.value, 4), "peer_median": number(score.median, 4),
            "score": number(score.score, 2), "direction": score.direction}
