"""The health verdicts as metric families (exporter/health/ judges them).

The verdicts' states are one-hot gauges over all five states, as Prometheus practice has
it for an enum (kube-state-metrics' phases): `gpu_health_state{state="failed"} == 0` is a
known "not failed", not a missing series. A check is served only while it says something
(warning, failed or unknown), one series of value 1 that names the state: the alerts select
`{check="...", state="failed"}`, and a healthy node serves none of them (21 checks a GPU
would otherwise be a fifth of its series; the verdict's one-hot says "ok"). The action is
one series with value 1 and the action and the reasons as labels, like
`gpu_recovery_action`: reasons are stable text (no values), so the series changes only
when the verdict does.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter.families import MINIMAL, Family
from exporter.health.model import FAILED, STATES, UNKNOWN, WARNING, NodeHealth
from exporter.metrics.gpu import GPU_LABELS
from exporter.sampling.snapshot import Snapshot

STATE_HELP = ("1 on the {whose} health state (ok, warning, failed, unknown, "
              "not_applicable), 0 on the others: the worst of its checks (docs/health.md).")
ACTION_HELP = ("The action the {whose} verdict asks for (none, restart_application, "
               "reset_gpu, reboot_node, drain_and_service), value 1, with the reasons in "
               "one line.")

STATE = Family(
    "gpu_health_state", "gauge", STATE_HELP.format(whose="GPU's"), (*GPU_LABELS, "state"),
    source="health checks", profile=MINIMAL,
    doc="1 on the GPU's state, 0 on the other four: the worst of its checks.")
ACTION = Family(
    "gpu_health_action", "gauge", ACTION_HELP.format(whose="GPU's"),
    (*GPU_LABELS, "action", "reason"), source="health checks", profile=MINIMAL,
    doc="Value 1: the action the GPU's verdict asks for (the strongest of its warning and "
        "failed checks) and the reasons in one line.")
CHECK_STATE = Family(
    "gpu_health_check_state", "gauge",
    "Value 1, one series per check that is warning, failed or unknown: its current state "
    "(docs/health.md lists the checks and the alerts on them).",
    (*GPU_LABELS, "check", "state"), source="health checks", profile=MINIMAL,
    doc="Value 1, one series per check of the GPU that is `warning`, `failed` or `unknown`, "
        "`state` its current state (a check's series changes `state` when it turns, and "
        "goes when the check is ok or not applicable again). The GPU-hardware alerts read "
        "it ([health.md](health.md#the-fault-table)).")
NODE_STATE = Family(
    "gpu_node_health_state", "gauge", STATE_HELP.format(whose="node's"), ("state",),
    source="health checks", profile=MINIMAL,
    doc="1 on the node's state: its worst GPU's and its own checks' (`gpu_count`, "
        "`nvlink_fabric`, `infiniband_ports`).")
NODE_ACTION = Family(
    "gpu_node_health_action", "gauge",
    ACTION_HELP.format(whose="node's") + " The node's verdict is its worst GPU's and its "
    "own checks'.", ("action", "reason"), source="health checks", profile=MINIMAL,
    doc="Value 1: the node's action and reasons (each GPU's named `GPU N: ...`).")
NODE_CHECK_STATE = Family(
    "gpu_node_health_check_state", "gauge",
    "Value 1, one series per node check (and per InfiniBand port for the port checks) "
    "that is warning, failed or unknown: its current state.",
    ("check", "device", "port", "state"), source="health checks", profile=MINIMAL,
    doc="Value 1, one series per node check that is `warning`, `failed` or `unknown`, "
        "`state` its current state; the InfiniBand checks once per port (`device`, `port`; "
        "empty for the others). The fabric alerts read it.")
CHECK_ERRORS = Family(
    "cte_health_check_errors_total", "counter",
    "Times a health check raised instead of judging (it reads unknown then).", ("check",),
    source="exporter",
    doc="Times a check raised instead of judging; it reads `unknown` then, and the other "
        "checks go on.")

# The check states a check family serves: what an alert or a person must see (ok and
# not_applicable say nothing the verdict's one-hot does not).
SERVED_CHECK_STATES = frozenset({WARNING, FAILED, UNKNOWN})

DECLARED = (STATE, ACTION, CHECK_STATE, NODE_STATE, NODE_ACTION, NODE_CHECK_STATE,
            CHECK_ERRORS)


def _gpu_labels(snapshot: Snapshot, gpu: int) -> list[str]:
    ident = snapshot.identities[gpu] if gpu < len(snapshot.identities) else None
    return [str(gpu), ident.uuid if ident is not None else ""]


def verdict_families(health: NodeHealth, snapshot: Snapshot) -> Iterator[Metric]:
    state, action, check = STATE.gauge(), ACTION.gauge(), CHECK_STATE.gauge()
    for gpu, v in sorted(health.gpus.items()):
        labels = _gpu_labels(snapshot, gpu)
        for name in STATES:
            state.add_metric([*labels, name], 1.0 if v.state == name else 0.0)
        action.add_metric([*labels, v.action, v.reasons], 1.0)
        for result in v.checks:
            if result.state in SERVED_CHECK_STATES:
                check.add_metric([*labels, result.name, result.state], 1.0)
    yield from (state, action, check)
    node = health.node
    node_state = NODE_STATE.gauge()
    for name in STATES:
        node_state.add_metric([name], 1.0 if node.state == name else 0.0)
    node_action = NODE_ACTION.gauge()
    node_action.add_metric([node.action, node.reasons], 1.0)
    node_check = NODE_CHECK_STATE.gauge()
    for result in node.checks:
        if result.state not in SERVED_CHECK_STATES:
            continue
        device, _, port = result.port.rpartition("/")
        node_check.add_metric([result.name, device, port, result.state], 1.0)
    yield from (node_state, node_action, node_check)
    yield CHECK_ERRORS.by_label(dict(health.check_errors))
