"""The verdict of each snapshot, judged once: `HealthMonitor.assess(snapshot)`.

Like rendering, the verdict is a function of the snapshot computed once and shared:
/metrics, /api/v1/health, the live page and the `health` command read the same
`NodeHealth`. The monitor keeps what a single snapshot cannot hold: the counter points
the rate checks compare against, and since when each check has been in its state. A
check that raises becomes `unknown` for that snapshot and is counted; it never stops the
others or the sweep. The snapshot and its verdict are published as one value,
`Published`: no reader gets one without the other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.collectors.infiniband.reading import InfinibandReading
from exporter.health import checks_board, checks_gpu, checks_links, checks_memory, checks_node
from exporter.health.context import Check, GpuInputs
from exporter.health.counters import CounterPoints
from exporter.health.faults import GPU, NODE, PORT, fault
from exporter.health.model import (
    NOT_APPLICABLE,
    NOT_JUDGED,
    UNKNOWN,
    CheckResult,
    NodeHealth,
    Outcome,
    Verdict,
    combine,
    unknown_health,
    verdict,
)
from exporter.health.settings import HealthSettings
from exporter.sampling.snapshot import Snapshot

log = logging.getLogger(__name__)

GPU_CHECKS: tuple[Check, ...] = (*checks_gpu.CHECKS, *checks_memory.CHECKS,
                                  *checks_links.CHECKS, *checks_board.CHECKS)
NODE_CHECKS: tuple[Check, ...] = checks_node.CHECKS
PORT_CHECKS: tuple[Check, ...] = checks_node.PORT_CHECKS
RE_JUDGE_SECONDS = 60.0  # judged again at least this often (XIDs age out of the hold)


def gpu_inputs_key(snapshot: Snapshot) -> tuple:
    """What the GPU checks read, in brief (and the node's checks besides the ports'):
    while it stays the same, so do the GPUs' verdicts."""
    return (snapshot.gpu_count, snapshot.expected_gpus,
            tuple(ident is None for ident in snapshot.identities),
            tuple((gpu, h.time) for gpu, h in sorted(snapshot.device_reads.items())),
            tuple((gpu, b.time) for gpu, b in sorted(snapshot.board.items())),
            tuple(sorted((key, r.count) for key, r in snapshot.xids.items())),
            snapshot.lost, tuple(sorted(snapshot.hung)),
            int(snapshot.time // RE_JUDGE_SECONDS))


def port_inputs_key(snapshot: Snapshot) -> tuple:
    """What the InfiniBand port checks read besides: the reads (their rates need each
    one) and the ports' states."""
    return (tuple(r.last_success for r in snapshot.collectors.values()
                  if isinstance(r.reading, InfinibandReading)),
            tuple((p.device, p.port, p.state_id)
                  for p in checks_node.infiniband_ports_of(snapshot)))


def inputs_key(snapshot: Snapshot) -> tuple[tuple, tuple]:
    """What the checks read, in brief: while it stays the same, so does the verdict; while
    its first part does, so do the GPUs' (the ports are read at their own times)."""
    return gpu_inputs_key(snapshot), port_inputs_key(snapshot)


def _action(scope: str, check: str, outcome: Outcome) -> str:
    try:
        row = fault(scope, check)
    except KeyError:  # a check the table lacks (a test's own): what it says
        return outcome.action
    return row.action(outcome.state, outcome.action)


class HealthMonitor:
    def __init__(self, settings: HealthSettings | None = None,
                 gpu_checks: Sequence[Check] = GPU_CHECKS,
                 node_checks: Sequence[Check] = NODE_CHECKS,
                 port_checks: Sequence[Check] = PORT_CHECKS):
        self.settings = settings or HealthSettings()
        self.gpu_checks, self.node_checks = tuple(gpu_checks), tuple(node_checks)
        self.port_checks = tuple(port_checks)
        self.counters = CounterPoints()
        # (gpu, check) -> its last outcome and result: an unchanged outcome keeps its
        # result (and its `since`), and a GPU whose results all held keeps its verdict
        self._results: dict[tuple[int | None, str], tuple[Outcome, CheckResult]] = {}
        self._verdicts: dict[int | None, Verdict] = {}
        self._errors: dict[str, int] = {}
        self._last: tuple[Snapshot, NodeHealth] | None = None
        self._key: tuple[tuple, tuple] | None = None
        # the GPUs' verdicts and the GPU inputs they were judged on: a snapshot whose
        # ports alone have moved keeps them (its node and port checks are judged again)
        self._gpus: tuple[tuple, dict[int, Verdict]] | None = None
        self._lock = threading.Lock()
        # what judging costs (bench/bench_cpu.py shows it): CPU-seconds and judgements
        self.cpu_seconds = 0.0
        self.judgements = 0

    def assess(self, snapshot: Snapshot) -> NodeHealth:
        """The snapshot's verdicts; the same object for the same snapshot, and the last
        one again while nothing the checks read has changed."""
        with self._lock:
            if self._last is not None and self._last[0] is snapshot:
                return self._last[1]
            try:
                key: tuple[tuple, tuple] | None = inputs_key(snapshot)
            except Exception:  # noqa: BLE001 - judged anew, and safely, below
                key = None
            if self._last is not None and key is not None and key == self._key:
                result = self._last[1]
            else:
                started = time.thread_time()
                result = self._judge_safely(snapshot, None if key is None else key[0])
                self._key = key
                self.judgements += 1
                self.cpu_seconds += time.thread_time() - started
            self._last = (snapshot, result)
            return result

    def _judge_safely(self, snapshot: Snapshot, gpu_key: tuple | None) -> NodeHealth:
        """The verdict, or, should judging itself fail (not one check: those are caught
        each), an unknown one: publishing the snapshot must go on."""
        try:
            return self._judge(snapshot, gpu_key)
        except Exception:  # noqa: BLE001 - the sampler's publishing must never stop here
            count = self._errors.get("verdict", 0) + 1
            self._errors["verdict"] = count
            if count == 1:
                log.exception("health verdict failed; it reads unknown until it works")
            return unknown_health(snapshot.time, snapshot.gpu_count, "health verdict failed",
                                  tuple(sorted(self._errors.items())))

    def _judge(self, snapshot: Snapshot, gpu_key: tuple | None) -> NodeHealth:
        kept = self._gpus
        if gpu_key is not None and kept is not None and kept[0] == gpu_key:
            gpus = kept[1]  # what the GPU checks read has not moved (read, never written)
        else:
            self._gpus = None
            gpus = {}
            for gpu in range(snapshot.gpu_count):
                inputs = GpuInputs(snapshot, gpu, self.settings, self.counters)
                results = tuple(self._run(check, inputs, gpu, snapshot.time, GPU)
                                for check in self.gpu_checks)
                gpus[gpu] = self._verdict(gpu, results, f"GPU {gpu}: ")
            if gpu_key is not None:
                self._gpus = (gpu_key, gpus)
        node_inputs = checks_node.NodeInputs(snapshot, self.settings, gpus, self.counters)
        own = [self._run(check, node_inputs, None, snapshot.time, NODE)
               for check in self.node_checks]
        own += self._ports(snapshot)
        own_verdict = self._verdict(None, tuple(own), "node: ")
        return NodeHealth(snapshot.time, combine(own_verdict, list(gpus.values())), gpus,
                          tuple(sorted(self._errors.items())))

    def _ports(self, snapshot: Snapshot) -> list[CheckResult]:
        """Each port check of each InfiniBand/RoCE port; where the node has none, each
        check once, not applicable."""
        ports = checks_node.infiniband_ports_of(snapshot)
        if not ports:
            return [CheckResult(check.name, NOT_APPLICABLE, None, None, check.source,
                                snapshot.time) for check in self.port_checks]
        out = []
        for port in ports:
            inputs = checks_node.PortInputs(snapshot, self.settings, self.counters, port)
            out += [self._run(check, inputs, None, snapshot.time, PORT, inputs.name)
                    for check in self.port_checks]
        return out

    def _run(self, check: Check, inputs: object, gpu: int | None, now: float, scope: str,
             port: str = "") -> CheckResult:
        try:
            outcome = check.judge(inputs)
        except Exception:  # noqa: BLE001 - one broken check must not break the verdict
            count = self._errors.get(check.name, 0) + 1
            self._errors[check.name] = count
            if count == 1:
                log.exception("health check %s failed; it reads unknown until it works",
                              check.name)
            outcome = Outcome(UNKNOWN, reason=f"{check.name} check failed")
        key = (gpu, f"{check.name} {port}" if port else check.name)
        last = self._results.get(key)
        if last is not None and last[0] == outcome:
            return last[1]
        since = last[1].since if last is not None and last[1].state == outcome.state else now
        # the action is the fault table's for the state (or, where it says so, the reading's)
        action = _action(scope, check.name, outcome)
        result = CheckResult(check.name, outcome.state, outcome.value, outcome.threshold,
                             check.source, since, action, outcome.reason, port)
        self._results[key] = (outcome, result)
        return result

    def _verdict(self, gpu: int | None, results: tuple[CheckResult, ...], prefix: str
                 ) -> Verdict:
        last = self._verdicts.get(gpu)
        if last is not None and len(last.checks) == len(results) and all(
                a is b for a, b in zip(last.checks, results, strict=True)):
            return last
        made = self._verdicts[gpu] = verdict(results, prefix)
        return made


@dataclass(frozen=True)
class Published:
    """One published value: a snapshot and its verdict, made together and never apart.

    The app publishes a snapshot only with the verdict judged on it (assess), and the
    goodput account's newest second is settled with that same verdict before the value
    is published (`Sampler.settle`). Every reader (the metrics and dcgm-exporter's names,
    /api/v1/*, the live page, the history) takes both from here: the verdict is never
    optional, and where nothing has judged it yet it is an explicit `unknown`
    (`model.unknown_health`), never a pass."""

    snapshot: Snapshot
    verdict: NodeHealth

    @classmethod
    def not_judged(cls, snapshot: Snapshot, reason: str = NOT_JUDGED) -> Published:
        """The snapshot with an explicit `unknown` verdict (tests and tools: nothing
        judged it)."""
        return cls(snapshot, unknown_health(snapshot.time, snapshot.gpu_count, reason))
