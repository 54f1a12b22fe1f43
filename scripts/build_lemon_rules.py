#!/usr/bin/env python3
# ruff: noqa: E501  (the PromQL it writes reads better unbroken)
"""Write the lemon score's rules from exporter/analysis/lemons.py, so PromQL and the
`lemons` command compute one score: alerts/lemons.yml (node-local: each node's and GPU's
episodes weighed by age and kind, summed), alerts/global-lemons.yml (the fleet's
mean, the scores, the alerts' gate, the alerts) and alerts/tests/lemons.test.yml (a test fleet whose expected scores come from the
command's own code). `--check` fails when a file is not what this script writes.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporter.analysis.lemons import (  # noqa: E402
    HARDWARE_XID_ACTIONS,
    NAME,
    WINDOWS,
    Model,
    counted,
    window_counts,
)
from exporter.commands.lemons import rank  # noqa: E402
from exporter.events import Event  # noqa: E402
from exporter.health.faults import xid_judgement  # noqa: E402

BUDGET = 0.99  # the alerts' gate: a member must reach the cluster's 99th percentile score
RUNBOOK = "https://github.com/cluster-telemetry-exporter/cluster-telemetry-exporter/blob/main/docs/runbooks.md#"
NODE = "cluster, job, instance"
GPU = "cluster, job, instance, gpu, uuid"
DAY = 86400


def _f(x: float) -> str:
    return repr(float(x))


def _regex(kinds) -> str:
    return "|".join(kinds)


# An XID's kind carries no code: the XIDs the score counts are read by the XID table's action
XID_EPISODES = {"gpu_node_episodes": "gpu_node_xid_episodes", "gpu_episodes": "gpu_xid_episodes"}


def _decayed(metric: str, by: str, model: Model) -> str:
    """Each member's episodes per weighed kind, weighed by age (window coefficients); the
    XIDs those whose action asks for a reset, a reboot or service (lemons.counted)."""
    kinds = [k for k in model.kinds if k != "xid"]
    actions = _regex(sorted(HARDWARE_XID_ACTIONS))
    terms = []
    for w, c in model.window_coefficients().items():
        if not c:  # a count: 28d alone
            continue
        terms.append(f'{_f(c)} * {metric}{{window="{w}", kind=~"{_regex(kinds)}"}}')
        if "xid" in model.kinds:
            terms.append(f'label_replace(\n    {_f(c)} * sum without (action) ('
                         f'{XID_EPISODES[metric]}{{window="{w}", action=~"{actions}"}}),\n'
                         '    "kind", "xid", "", "")')
    return f"sum by ({by}, kind) (\n  " + "\n  or ".join(terms) + "\n)"


def _weighed(decayed: str, by: str, model: Model) -> str:
    """The weighed sum over the kinds (kinds of one weight share a term)."""
    by_weight: dict[float, list[str]] = {}
    for kind in model.kinds:
        by_weight.setdefault(model.weight(kind), []).append(kind)
    terms = [f'{_f(w)} * {decayed}{{kind{"=~" if len(kinds) > 1 else "="}"{_regex(kinds)}"}}'
             for w, kinds in sorted(by_weight.items(), reverse=True)]
    return f"sum by ({by}) (\n  " + "\n  or ".join(terms) + "\n)"


def node_rules(model: Model) -> dict:
    nk, gk = "instance_kind:gpu_node_episodes:by_age", "instance_gpu_kind:gpu_episodes:by_age"
    rules = [{"record": nk, "expr": _decayed("gpu_node_episodes", NODE, model)},
             {"record": "instance:gpu_node_lemon_count:sum",
              "expr": _weighed(nk, NODE, model)},
             {"record": gk, "expr": _decayed("gpu_episodes", GPU, model)},
             {"record": "instance_gpu:gpu_lemon_count:sum",
              "expr": _weighed(gk, GPU, model)}]
    return {"groups": [{"name": "cte-lemon-node", "rules": rules}]}


# the members of the fleet: every node that keeps a history, and its GPUs; quiet ones at 0
FLEET_NODES = "gpu_node_history_start_timestamp_seconds"
FLEET_GPUS = f"(gpu_up and on ({NODE}) {FLEET_NODES})"


def _fleet(level: str, by: str, members: str) -> list[dict]:
    """The cluster's members, their mean count, each member's score and the gate."""
    name = "instance" if level == "gpu_node" else "instance_gpu"
    count = f"{name}:{level}_lemon_count:sum"
    score = f"{name}:{level}_lemon_score:ratio"
    return [
        {"record": f"cluster:{level}_lemon_members:count",
         "expr": f"count by (cluster) ({members})"},
        {"record": f"cluster:{level}_lemon_count:mean",
         "expr": f"sum by (cluster) ({count})\n"
                 f"/ on (cluster) cluster:{level}_lemon_members:count"},
        {"record": score,
         "expr": f"{count}\n/ on (cluster) group_left ()\n"
                 f"(cluster:{level}_lemon_count:mean > 0)\n> 0"},
        {"record": f"cluster:{level}_lemon_score:budget",
         "expr": f"quantile by (cluster) (\n  {BUDGET},\n"
                 f"  {score} or on ({by}) 0 * {members}\n)"},
    ]


WHAT = (f"{NAME} as the cluster's average (the lemon score, against the mean of the "
        "cluster's members; among the top 1 % of them). Episodes: ")


def _alert(name: str, level: str, by: str, what: str, episodes: str, match: str,
           model: Model) -> dict:
    score = f"{'instance' if level == 'gpu_node' else 'instance_gpu'}:{level}_lemon_score:ratio"
    reasons = ("{{ range printf `sort_desc(" + episodes + "{" + match + "})` " +
               ("$labels.instance" if level == "gpu_node" else "$labels.instance $labels.gpu") +
               " | query }}{{ .Labels.kind }} {{ .Value }} in 28 d; {{ end }}")
    return {
        "alert": name,
        "expr": f"{score} > 1\nand on ({by})\n"
                f"{score} > on (cluster) group_left () cluster:{level}_lemon_score:budget",
        "for": "15m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": f"{what} is a lemon: {{{{ $value | printf \"%.1f\" }}}}x its cluster's "
                       f"average {NAME}",
            "description": f"{what} had {{{{ $value | printf \"%.1f\" }}}} times "
                           "as many " + WHAT + reasons,
            "runbook_url": RUNBOOK + name.lower(),
        },
    }


def global_rules(model: Model) -> dict:
    alerts = [
        _alert("GpuNodeLemon", "gpu_node", NODE, "Node {{ $labels.instance }}",
               "instance_kind:gpu_node_episodes:by_age", "instance=%q", model),
        _alert("GpuLemon", "gpu", GPU, "GPU {{ $labels.gpu }} on {{ $labels.instance }}",
               "instance_gpu_kind:gpu_episodes:by_age", "instance=%q, gpu=%q", model),
    ]
    return {"groups": [{"name": "cte-lemon-node-fleet",
                        "rules": _fleet("gpu_node", NODE, FLEET_NODES)},
                       {"name": "cte-lemon-gpu-fleet", "rules": _fleet("gpu", GPU, FLEET_GPUS)},
                       {"name": "cte-lemon-alerts", "rules": alerts}]}


# -- the test fleet: 100 nodes of 2 GPUs; the expected scores come from `lemons` itself ---

T = 1800.0  # promtool's clock at the evaluation below (30m)
NODES = 100
GPUS = 2
INSTANCE = "node-{:02d}:9955"
# node -> (age in days, kind, gpu[, XID code]); zero-valued windows too (node 3), a kind the
# score weighs 0 (ib_link_down, thermal, ...), XIDs that ask for a reset or reboot (48, 79)
# and ones that do not (13, 94: not counted), a young node (its history began 3 days ago: it
# counts in the fleet the same)
FLEET: dict[int, list[tuple]] = {
    3: [(0.5, "ecc_dbe", "1"), (3.0, "ecc_dbe", "1"), (8.0, "ecc_dbe", "1"),
        (10.0, "xid", "1", 79), (12.0, "xid", "0", 48)],
    7: [(2.0, "ib_link_down", None)],
    11: [(20.0, "unknown", None)],
    15: [(5.0, "thermal", None), (6.0, "thermal", None)],
    20: [(0.2, "health_failed", None), (15.0, "software", None)],
    42: [(25.0, "gpu_lost", "0")],
    50: [(1.5, "xid", "0", 13), (2.5, "xid", "0", 48), (4.0, "xid", "1", 94)],
}
YOUNG = {7: 3.0}
HISTORY_DAYS = 40.0
# a fleet of 40 nodes with one PCIe degradation each and one with two: the repeat ranks first
REPEAT: dict[int, list[tuple[float, str, str | None]]] = {
    n: [(10.0, "pcie_degraded", "0")] + ([(12.0, "pcie_degraded", "0")] if n == 40 else [])
    for n in range(41)}


def fleet_events(fleet=FLEET) -> list[Event]:
    out = [Event(T - ev[0] * DAY, INSTANCE.format(n), ev[1], ev[2], *ev[3:])
           for n, evs in fleet.items() for ev in evs]
    return sorted(out, key=lambda e: e.time)


def _windows(ages: list[float]) -> dict[str, int]:
    """Episodes per window, the empty ones at 0 (a node may export those)."""
    counts = window_counts(ages)
    return {w: int(counts.get(w, 0)) for w, _ in WINDOWS}


def _series(fleet, young) -> list[dict]:
    out = []
    for n in range(NODES):
        inst = INSTANCE.format(n)
        start = T - young.get(n, HISTORY_DAYS) * DAY
        out.append({"series": f'gpu_node_history_start_timestamp_seconds{{instance="{inst}", '
                    f'job="gpu"}}', "values": f"{start:.0f}x40"})
        for g in range(GPUS):
            out.append({"series": f'gpu_up{{instance="{inst}", job="gpu", gpu="{g}", '
                        f'uuid="GPU-{n}-{g}"}}', "values": "1x40"})
        evs = [(ev[0], ev[1], ev[2], _action(ev)) for ev in fleet.get(n, [])]
        for kind in sorted({k for _, k, _, _ in evs}):
            for w, c in _windows([a for a, k, _, _ in evs if k == kind]).items():
                if c or n == 3:  # node 3 exports its zero windows, the others leave them out
                    out.append({"series": f'gpu_node_episodes{{instance="{inst}", job="gpu", '
                                f'kind="{kind}", window="{w}"}}', "values": f"{c}x40"})
        for action in sorted({x for _, _, _, x in evs if x}):
            for w, c in _windows([a for a, _, _, x in evs if x == action]).items():
                if c:
                    out.append({"series": f'gpu_node_xid_episodes{{instance="{inst}", '
                                f'job="gpu", action="{action}", window="{w}"}}',
                                "values": f"{c}x40"})
        for gpu in sorted({g for _, _, g, _ in evs if g is not None}):
            for kind in sorted({k for _, k, g, _ in evs if g == gpu}):
                for w, c in _windows([a for a, k, g, _ in evs if k == kind and g == gpu]).items():
                    if c:
                        out.append({"series": f'gpu_episodes{{instance="{inst}", job="gpu", '
                                    f'gpu="{gpu}", uuid="GPU-{n}-{gpu}", kind="{kind}", '
                                    f'window="{w}"}}', "values": f"{c}x40"})
            for action in sorted({x for _, _, g, x in evs if g == gpu and x}):
                for w, c in _windows([a for a, _, g, x in evs if x == action and g == gpu]).items():
                    if c:
                        out.append({"series": f'gpu_xid_episodes{{instance="{inst}", job="gpu", '
                                    f'gpu="{gpu}", uuid="GPU-{n}-{gpu}", action="{action}", '
                                    f'window="{w}"}}', "values": f"{c}x40"})
    return out


def _action(ev: tuple) -> str:
    """An XID event's action, as the node's history exports it ("" for another kind)."""
    return xid_judgement(ev[3]).action if ev[1] == "xid" and len(ev) > 3 else ""


def _reasons(fleet, n: int, gpu: str | None, model: Model) -> str:
    kinds = {}
    for age, kind, g, *xid in fleet.get(n, []):
        if age < 28 and (gpu is None or g == gpu) and model.weight(kind) > 0 and counted(
                kind, xid[0] if xid else None):
            kinds[kind] = kinds.get(kind, 0) + 1
    return "".join(f"{k} {c} in 28 d; " for k, c in sorted(kinds.items(), key=lambda x: (-x[1], x[0])))


def _expected(fleet, model: Model):
    """The command's ranking of the fleet, and its scores as input series."""
    ranking = rank(fleet_events(fleet), T, NODES, GPUS, model)
    # the command's scores travel as input series; the rules' must match each within 0.1 %
    node_labels = [(f'instance="{s.key}", job="gpu"', s.score) for s in ranking.nodes]
    gpu_labels = [(f'instance="{node}", job="gpu", gpu="{g}", uuid="GPU-{int(node[5:7])}-{g}"',
                   s.score) for node, gs in ranking.gpus.items() for g, s in gs]
    expected = [{"series": f"lemons_command_node_score{{{lab}}}", "values": f"{v!r}x40"}
                for lab, v in node_labels]
    expected += [{"series": f"lemons_command_gpu_score{{{lab}}}", "values": f"{v!r}x40"}
                 for lab, v in gpu_labels]
    return ranking, node_labels, gpu_labels, expected


def _agree(node_labels, gpu_labels) -> list[dict]:
    """Each member's score from the rules within 0.1 % of the command's, none more."""
    return [{"expr": "abs(instance:gpu_node_lemon_score:ratio / on (instance, job) "
                     "lemons_command_node_score - 1) < bool 0.001", "eval_time": "30m",
             "exp_samples": [{"labels": f"{{{lab}}}", "value": 1} for lab, _ in node_labels]},
            {"expr": "count(instance:gpu_node_lemon_score:ratio)", "eval_time": "30m",
             "exp_samples": [{"labels": "{}", "value": len(node_labels)}]},
            {"expr": "abs(instance_gpu:gpu_lemon_score:ratio / on (instance, job, gpu, uuid) "
                     "lemons_command_gpu_score - 1) < bool 0.001", "eval_time": "30m",
             "exp_samples": [{"labels": f"{{{lab}}}", "value": 1} for lab, _ in gpu_labels]},
            {"expr": "count(instance_gpu:gpu_lemon_score:ratio)", "eval_time": "30m",
             "exp_samples": [{"labels": "{}", "value": len(gpu_labels)}]}]


def _quantile(values: list[float], q: float) -> float:
    """PromQL's quantile: linear between the two ranks around q x (N - 1)."""
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def _alerting(scores: list[float], members: int) -> float:
    """The gate: the cluster's 99th percentile score, quiet members at 0."""
    return _quantile(scores + [0.0] * (members - len(scores)), BUDGET)


def _node_alerts(fleet, ranking, model: Model) -> dict:
    gate = _alerting([s.score for s in ranking.nodes], NODES)
    return {"eval_time": "30m", "alertname": "GpuNodeLemon", "exp_alerts": [{
        "exp_labels": {"instance": s.key, "job": "gpu", "severity": "warning"},
        "exp_annotations": {
            "summary": f"Node {s.key} is a lemon: {s.score:.1f}x its cluster's average {NAME}",
            "description": f"Node {s.key} had {s.score:.1f} times as many " + WHAT + _reasons(fleet, int(s.key[5:7]), None, model),
            "runbook_url": RUNBOOK + "gpunodelemon"}}
        for s in ranking.nodes if s.score > 1 and s.score > gate]}


def _gpu_alerts(fleet, ranking, model: Model) -> dict:
    gpus = [(node, g, s) for node, gs in ranking.gpus.items() for g, s in gs]
    gate = _alerting([s.score for _, _, s in gpus], NODES * GPUS)
    return {"eval_time": "30m", "alertname": "GpuLemon", "exp_alerts": [{
        "exp_labels": {"instance": node, "job": "gpu", "gpu": g,
                       "uuid": f"GPU-{int(node[5:7])}-{g}", "severity": "warning"},
        "exp_annotations": {
            "summary": f"GPU {g} on {node} is a lemon: {s.score:.1f}x its cluster's average "
                       f"{NAME}",
            "description": f"GPU {g} on {node} had {s.score:.1f} times as many " + WHAT + _reasons(fleet, int(node[5:7]), g, model),
            "runbook_url": RUNBOOK + "gpulemon"}}
        for node, g, s in sorted(gpus, key=lambda x: -x[2].score)
        if s.score > 1 and s.score > gate]}


def tests_file(model: Model) -> dict:
    ranking, node_labels, gpu_labels, expected = _expected(FLEET, model)
    repeat, repeat_nodes, repeat_gpus, repeat_expected = _expected(REPEAT, model)
    old = {3: [(29.0, "ecc_dbe", "1")]}  # only an episode past every window
    return {
        "rule_files": ["../lemons.yml", "../global-lemons.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", "name": "lemon scores: the rules rank as the lemons command",
             "input_series": _series(FLEET, YOUNG) + expected,
             "promql_expr_test": _agree(node_labels, gpu_labels),
             "alert_rule_test": [
                 _node_alerts(FLEET, ranking, model),
                 _gpu_alerts(FLEET, ranking, model),
                 {"eval_time": "10m", "alertname": "GpuNodeLemon", "exp_alerts": []},
             ]},
            {"interval": "1m",
             "name": "lemon scores of a fleet of single faults: the repeat ranks first and alerts",
             "input_series": _series(REPEAT, {}) + repeat_expected,
             "promql_expr_test": _agree(repeat_nodes, repeat_gpus),
             "alert_rule_test": [_node_alerts(REPEAT, repeat, model)]},
            {"interval": "1m",
             "name": "lemon near miss: an episode older than every window scores nothing",
             "input_series": _series(old, {}),
             "alert_rule_test": [
                 {"eval_time": "30m", "alertname": "GpuNodeLemon", "exp_alerts": []},
                 {"eval_time": "30m", "alertname": "GpuLemon", "exp_alerts": []}]},
        ],
    }


HEADERS = {
    "lemons.yml": "# The lemon score, node-local half: each node's and GPU's episodes (gpu_node_episodes,\n"
                  "# gpu_episodes) of the kinds the score weighs, summed (the score's numerator); its\n"
                  "# XIDs those whose action asks for a reset, a reboot or service (gpu_*xid_episodes).\n"
                  "# Written by scripts/build_lemon_rules.py from exporter/analysis/lemons.py: edit those.\n",
    "global-lemons.yml": "# The lemon score, global half: each member's count against the mean of the\n"
                         "# cluster's members (every node keeping a history, and its GPUs; quiet ones at 0), and\n"
                         "# the alerts, gated at the cluster's 99th percentile score (at most about 1 % of its\n"
                         "# nodes or GPUs at a time). Across nodes: run where every node's series meet.\n"
                         "# Written by scripts/build_lemon_rules.py from exporter/analysis/lemons.py: edit those.\n",
    "tests/lemons.test.yml": "# promtool test rules alerts/tests/lemons.test.yml: the rules score a test fleet as\n"
                             "# `lemons` does (expected values from its code), and the alerts fire and miss.\n"
                             "# Written by scripts/build_lemon_rules.py: run it after changing the score.\n",
}


def _dump(obj: dict) -> str:
    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, data):
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump(obj, Dumper=Dumper, sort_keys=False, width=120, allow_unicode=True)


def files() -> dict[str, str]:
    model = Model()
    bodies = {"lemons.yml": node_rules(model), "global-lemons.yml": global_rules(model),
              "tests/lemons.test.yml": tests_file(model)}
    return {name: HEADERS[name] + _dump(body) for name, body in bodies.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if a file is not current")
    args = parser.parse_args(argv)
    stale = []
    for name, text in files().items():
        path = REPO / "alerts" / name
        if args.check:
            old = path.read_text() if path.exists() else ""
            if old != text:
                stale.append(name)
                sys.stdout.writelines(difflib.unified_diff(
                    old.splitlines(True), text.splitlines(True), f"alerts/{name}", "generated"))
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}: run scripts/build_lemon_rules.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
