"""Goodput families: each GPU's seconds and energy by state (docs/goodput.md)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter.analysis.goodput import STATES
from exporter.families import FULL, Family
from exporter.metrics.exposition import Rows
from exporter.metrics.gpu import GPU_LABELS
from exporter.sampling.snapshot import Snapshot

_SOURCE = "goodput account"
PRODUCTIVE = STATES[0]
_STATES = ", ".join(f"`{s}`" for s in STATES)

TIME = Family(
    "gpu_time_seconds_total", "counter",
    "Seconds the GPU spent in each state: productive, checkpoint, stalled, starting, idle, "
    "failed, unallocated, unknown (they add up to the time accounted).",
    (*GPU_LABELS, "state"), unit="s", source=_SOURCE,
    doc=f"Seconds the GPU spent in each `state` ({_STATES}; rules and evidence in "
        "[goodput.md](goodput.md)); they add up, with `gpu_time_pending_seconds`, to the time "
        "since the account began. A pause is counted when it is decided (steps again: "
        "checkpoint; longer than 15 minutes: idle). A state's series appears once the GPU "
        "has spent time in it (`productive` from the start).")
ENERGY = Family(
    "gpu_state_energy_joules_total", "counter",
    "Energy the GPU spent in each state (its mean power times the seconds).",
    (*GPU_LABELS, "state"), unit="J", source=_SOURCE,
    doc="Energy the GPU spent in each `state`: the stall window's mean power times the "
        "seconds (the exporter's samples, not the driver's energy counter). Energy per "
        "productive GPU-hour and energy spent on badput come from it.")
PENDING = Family(
    "gpu_time_pending_seconds", "gauge",
    "Seconds of a pause under way not yet given a state (checkpoint if steps follow).",
    tuple(GPU_LABELS), unit="s", source=_SOURCE, profile=FULL,
    doc="Seconds of a pause under way that are not yet in `gpu_time_seconds_total`: "
        "checkpoint if the job steps again, idle if it lasts past 15 minutes.")
DURATION = Family(
    "cte_goodput_account_duration_seconds", "gauge",
    "What the last goodput account update cost.", unit="s", source="sampler", profile=FULL)

DECLARED = (TIME, ENERGY, PENDING, DURATION)


def goodput_families(snapshot: Snapshot) -> Iterator[Metric]:
    account = snapshot.goodput
    if account is None:
        return
    seconds, joules, pending = Rows.of(TIME), Rows.of(ENERGY), Rows.of(PENDING)
    by_gpu = account.seconds.tolist(), account.joules.tolist(), account.pending.tolist()
    for gpu, ident in enumerate(snapshot.identities):
        # a lost GPU keeps its series: its failed time is the point
        if ident is None or gpu >= len(by_gpu[2]):
            continue
        labels = (str(gpu), ident.uuid)
        for state, s, j in zip(STATES, by_gpu[0][gpu], by_gpu[1][gpu], strict=True):
            # a state's series appear once the GPU spent time in it (productive from the
            # start): most GPUs see few of the eight, and the series count is a budget
            if s > 0 or state == PRODUCTIVE:
                seconds.add((*labels, state), s)
                joules.add((*labels, state), j)
        pending.add(labels, by_gpu[2][gpu])
    yield from (seconds, joules, pending)
    yield DURATION.gauge(account.duration_seconds)
