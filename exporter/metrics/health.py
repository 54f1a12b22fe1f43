"""The health verdicts as metric families (exporter/health/ judges them).

States are one-hot gauges over all five states, as Prometheus practice has it for an
enum (kube-state-metrics' phases): `gpu_health_state{state="failed"} == 0` is a known
"not failed", not a missing series. The action is one series with value 1 and the
action and the reasons as labels, like `gpu_recovery_action`: reasons are stable text
(no values), so the series changes only when the verdict does.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.health.model import STATES, NodeHealth
from exporter.metrics.gpu import GPU_LABELS
from exporter.sampling.snapshot import Snapshot

STATE_HELP = ("1 on the {whose} health state (ok, warning, failed, unknown, "
              "not_applicable), 0 on the others: the worst of its checks (docs/health.md).")
ACTION_HELP = ("The action the {whose} verdict asks for (none, restart_application, "
               "reset_gpu, reboot_node, drain_and_service), value 1, with the reasons in "
               "one line.")


def _gpu_labels(snapshot: Snapshot, gpu: int) -> list[str]:
    ident = snapshot.identities[gpu] if gpu < len(snapshot.identities) else None
    return [str(gpu), ident.uuid if ident is not None else ""]


def verdict_families(health: NodeHealth, snapshot: Snapshot) -> Iterator[Metric]:
    state = GaugeMetricFamily("gpu_health_state", STATE_HELP.format(whose="GPU's"),
                              labels=[*GPU_LABELS, "state"])
    action = GaugeMetricFamily("gpu_health_action", ACTION_HELP.format(whose="GPU's"),
                               labels=[*GPU_LABELS, "action", "reason"])
    check = GaugeMetricFamily("gpu_health_check_state",
                              "1 on each check's state, 0 on the others (docs/health.md "
                              "lists the checks).", labels=[*GPU_LABELS, "check", "state"])
    for gpu, v in sorted(health.gpus.items()):
        labels = _gpu_labels(snapshot, gpu)
        for name in STATES:
            state.add_metric([*labels, name], 1.0 if v.state == name else 0.0)
        action.add_metric([*labels, v.action, v.reasons], 1.0)
        for result in v.checks:
            for name in STATES:
                check.add_metric([*labels, result.name, name],
                                 1.0 if result.state == name else 0.0)
    yield from (state, action, check)
    node = health.node
    node_state = GaugeMetricFamily("gpu_node_health_state", STATE_HELP.format(whose="node's"),
                                   labels=["state"])
    for name in STATES:
        node_state.add_metric([name], 1.0 if node.state == name else 0.0)
    node_action = GaugeMetricFamily("gpu_node_health_action",
                                    ACTION_HELP.format(whose="node's") + " The node's "
                                    "verdict is its worst GPU's and its own checks'.",
                                    labels=["action", "reason"])
    node_action.add_metric([node.action, node.reasons], 1.0)
    node_check = GaugeMetricFamily("gpu_node_health_check_state",
                                   "1 on each node check's state, 0 on the others.",
                                   labels=["check", "state"])
    for result in node.checks:
        for name in STATES:
            node_check.add_metric([result.name, name], 1.0 if result.state == name else 0.0)
    errors = CounterMetricFamily("cte_health_check_errors",
                                 "Times a health check raised instead of judging (it reads "
                                 "unknown then).", labels=["check"])
    for name, count in health.check_errors:
        errors.add_metric([name], count)
    yield from (node_state, node_action, node_check, errors)
