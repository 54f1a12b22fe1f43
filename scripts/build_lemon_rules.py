#!/usr/bin/env python3
# ruff: noqa: E501  (the PromQL it writes reads better unbroken)
"""Write the lemon score's rules from exporter/analysis/lemons.py, so PromQL and the
`lemons` command compute one score: alerts/lemons.yml (node-local: each node's decayed
counts and exposure), alerts/global-lemons.yml (the fleet's prior, the scores, the alerts)
and alerts/tests/lemons.test.yml (a test fleet whose expected scores come from the
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
    GROUP_OF,
    GROUPS,
    MIN_EXPOSURE_DAYS,
    WINDOWS,
    Model,
)
from exporter.events import Event  # noqa: E402
from exporter.offline.lemons import rank  # noqa: E402

BUDGET = 0.99  # the alerts' gate: a member must reach the cluster's 99th percentile score
RUNBOOK = "https://github.com/cluster-telemetry-exporter/cluster-telemetry-exporter/blob/main/docs/runbooks.md#"
NODE = "cluster, job, instance"
GPU = "cluster, job, instance, gpu, uuid"
DAY = 86400


def _f(x: float) -> str:
    return repr(float(x))


def _kinds(group: str) -> str:
    return "|".join(GROUPS[group])


def _decayed(metric: str, by: str, group: str, model: Model) -> str:
    terms = [f'{_f(c)} * {metric}{{window="{w}", kind=~"{_kinds(group)}"}}'
             for w, c in model.window_coefficients().items()]
    return f"sum by ({by}) (\n  " + "\n  or ".join(terms) + "\n)"


def _exposure(model: Model) -> str:
    days = f"(time() - {'gpu_node_history_start_timestamp_seconds'}) / {DAY}"
    parts, lo = [], 0.0
    for w, (_, hi) in zip(model.segment_weights(), WINDOWS, strict=True):
        parts.append(f"{_f(w)} * clamp({days} - {lo:g}, 0, {hi - lo:g})")
        lo = hi
    floor = MIN_EXPOSURE_DAYS * model.segment_weights()[0]
    return f"sum by ({NODE}) (\n  clamp_min(\n    " + "\n    + ".join(parts) + \
        f",\n    {_f(floor)}\n  )\n)"


def node_rules(model: Model) -> dict:
    rules: list[dict] = [{"record": "instance:gpu_node_lemon_exposure_days:decayed",
                          "expr": _exposure(model)},
                         {"record": "instance_gpu:gpu_lemon_exposure_days:decayed",
                          "expr": f"sum by ({GPU}) (0 * gpu_up)\n"
                          f"+ on ({NODE}) group_left ()\n"
                          "instance:gpu_node_lemon_exposure_days:decayed"}]
    for g in GROUPS:
        rules.append({"record": "instance_group:gpu_node_episodes:decayed",
                      "expr": _decayed("gpu_node_episodes", NODE, g, model),
                      "labels": {"group": g}})
    for g in GROUPS:
        rules.append({"record": "instance_gpu_group:gpu_episodes:decayed",
                      "expr": _decayed("gpu_episodes", GPU, g, model), "labels": {"group": g}})
    return {"groups": [{"name": "cte-lemon-node", "rules": rules}]}


def _at_least(raw: str, c: str, model: Model) -> str:
    """raw, floored at the spread floor x mu^2 (at 0 where the model has no floor)."""
    if model.spread_floor <= 0:
        return f"clamp_min(\n  {raw},\n  0\n)"
    floor = f"{_f(model.spread_floor)} * {c}:mean ^ 2"
    return f"(\n  {raw}\n  > {floor}\n)\nor {floor}"


def _fleet(level: str, by: str, counts: str, exposure: str, model: Model) -> list[dict]:
    """The moments fit of each group's gamma prior over the cluster's members."""
    c = f"cluster_group:{level}_lemon_rate"
    raw = (f"(\n"
           f"    cluster_group:{level}_lemon_episodes:sum_squares_per_exposure\n"
           f"    - {c}:mean * cluster_group:{level}_lemon_episodes:sum\n"
           f"    - {c}:mean * on (cluster) group_left () (cluster:{level}_lemon_members:count - 1)\n"
           f"  )\n  / on (cluster) group_left () (\n"
           f"    cluster:{level}_lemon_exposure_days:sum\n"
           f"    - cluster:{level}_lemon_exposure_days:sum_squares"
           f" / cluster:{level}_lemon_exposure_days:sum\n"
           f"  )")
    return [
        {"record": f"cluster:{level}_lemon_members:count", "expr": f"count by (cluster) ({exposure})"},
        {"record": f"cluster:{level}_lemon_exposure_days:sum", "expr": f"sum by (cluster) ({exposure})"},
        {"record": f"cluster:{level}_lemon_exposure_days:sum_squares",
         "expr": f"sum by (cluster) ({exposure} ^ 2)"},
        {"record": f"cluster_group:{level}_lemon_episodes:sum",
         "expr": f"sum by (cluster, group) ({counts})"},
        {"record": f"cluster_group:{level}_lemon_episodes:sum_squares_per_exposure",
         "expr": f"sum by (cluster, group) (\n  {counts} ^ 2\n"
                 f"  / on ({by}) group_left () {exposure}\n)"},
        {"record": f"{c}:mean",
         "expr": f"cluster_group:{level}_lemon_episodes:sum\n"
                 f"/ on (cluster) group_left () cluster:{level}_lemon_exposure_days:sum"},
        # var = (S - (N - 1) mu) / (sum E - sum E^2 / sum E), S = sum n^2/E - mu sum n,
        # at least the spread floor x mu^2
        {"record": f"{c}:var", "expr": _at_least(raw, c, model)},
    ]


def _posterior(level: str, by: str, counts: str, exposure: str, group: str) -> dict:
    """(mu^2 + var n) / (mu + var E): the gamma-Poisson posterior mean rate of each member."""
    c = f"cluster_group:{level}_lemon_rate"
    n = (f"(\n    sum by ({by}) ({counts}{{group=\"{group}\"}})\n"
         f"    or on ({by}) 0 * {exposure}\n  )")
    mean = f'({c}:mean{{group="{group}"}} > 0)'
    var = f'{c}:var{{group="{group}"}}'
    return {"record": f"{'instance' if level == 'gpu_node' else 'instance_gpu'}_group:"
                      f"{level}_lemon_rate:posterior",
            "expr": f"(\n  {n} * on (cluster) group_left () {var}\n"
                    f"  + on (cluster) group_left () {mean} ^ 2\n)\n/ (\n"
                    f"  {exposure} * on (cluster) group_left () {var}\n"
                    f"  + on (cluster) group_left () {mean}\n)",
            "labels": {"group": group}}


def _weighted(series: str, model: Model) -> str:
    """series per scored group times the group's weight, as one vector (group label kept)."""
    return "\n  or ".join(f'{_f(model.weight(g))} * {series}{{group="{g}"}}' for g in model.groups)


def _score(level: str, by: str, counts: str, model: Model) -> dict:
    groups = "|".join(model.groups)
    name = "instance" if level == "gpu_node" else "instance_gpu"
    return {"record": f"{name}:{level}_lemon_score:ratio",
            "expr": f"sum by ({by}) (\n  {_weighted(f'{name}_group:{level}_lemon_rate:posterior', model)}\n)\n"
                    f"/ on (cluster) group_left ()\n"
                    f"sum by (cluster) (\n  {_weighted(f'cluster_group:{level}_lemon_rate:mean', model)}\n)\n"
                    f"and on ({by})\n"
                    f"sum by ({by}) ({counts}{{group=~\"{groups}\"}}) > 0"}


def _gate(level: str, by: str, exposure: str) -> dict:
    name = "instance" if level == "gpu_node" else "instance_gpu"
    return {"record": f"cluster:{level}_lemon_score:budget",
            "expr": f"quantile by (cluster) (\n  {BUDGET},\n"
                    f"  {name}:{level}_lemon_score:ratio or on ({by}) 0 * {exposure}\n)"}


def _alert(name: str, level: str, by: str, what: str, episodes: str, match: str,
           model: Model) -> dict:
    score = f"{'instance' if level == 'gpu_node' else 'instance_gpu'}:{level}_lemon_score:ratio"
    # the episodes of the kinds the score weighs
    scored = "|".join(k for g in model.groups for k in GROUPS[g])
    reasons = ("{{ range printf `sort_desc(" + episodes + "{" + match +
               ", window=\"28d\", kind=~\"" + scored + "\"})` " + ("$labels.instance" if level == "gpu_node"
                                          else "$labels.instance $labels.gpu") +
               " | query }}{{ .Labels.kind }} {{ .Value }} in 28 d; {{ end }}")
    return {
        "alert": name,
        "expr": f"{score} > 1\nand on ({by})\n"
                f"{score} > on (cluster) group_left () cluster:{level}_lemon_score:budget",
        "for": "15m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": f"{what} is a lemon: it fails {{{{ $value | printf \"%.1f\" }}}}x as "
                       "often as its fleet",
            "description": f"{what} fails {{{{ $value | printf \"%.1f\" }}}} times as often as "
                           "the cluster's average (the lemon score: its episodes of the last 28 days "
                           "against the fleet's rate per kind group, among the top 1 % of the "
                           f"cluster). Episodes: {reasons}",
            "runbook_url": RUNBOOK + name.lower(),
        },
    }


def global_rules(model: Model) -> dict:
    ne, ge = "instance:gpu_node_lemon_exposure_days:decayed", "instance_gpu:gpu_lemon_exposure_days:decayed"
    nc, gc = "instance_group:gpu_node_episodes:decayed", "instance_gpu_group:gpu_episodes:decayed"
    node = (_fleet("gpu_node", NODE, nc, ne, model) + [_posterior("gpu_node", NODE, nc, ne, g) for g in GROUPS]
            + [_score("gpu_node", NODE, nc, model), _gate("gpu_node", NODE, ne)])
    gpu = (_fleet("gpu", GPU, gc, ge, model) + [_posterior("gpu", GPU, gc, ge, g) for g in GROUPS]
           + [_score("gpu", GPU, gc, model), _gate("gpu", GPU, ge)])
    alerts = [
        _alert("GpuNodeLemon", "gpu_node", NODE, "Node {{ $labels.instance }}",
               "gpu_node_episodes", "instance=%q", model),
        _alert("GpuLemon", "gpu", GPU, "GPU {{ $labels.gpu }} on {{ $labels.instance }}",
               "gpu_episodes", "instance=%q, gpu=%q", model),
    ]
    return {"groups": [{"name": "cte-lemon-node-fleet", "rules": node},
                       {"name": "cte-lemon-gpu-fleet", "rules": gpu},
                       {"name": "cte-lemon-alerts", "rules": alerts}]}


# -- the test fleet: 100 nodes of 2 GPUs; the expected scores come from `lemons` itself ---

T = 1800.0  # promtool's clock at the evaluation below (30m)
NODES = 100
GPUS = 2
INSTANCE = "node-{:02d}:9955"
# node -> (age in days, kind, gpu); a young node (history 3 days) and zero-valued windows too
FLEET: dict[int, list[tuple[float, str, str | None]]] = {
    3: [(0.5, "ecc_dbe", "1"), (3.0, "ecc_dbe", "1"), (8.0, "ecc_dbe", "1"), (10.0, "xid", "1"),
        (12.0, "xid", "0")],
    7: [(2.0, "ib_link_down", None)],
    11: [(20.0, "unknown", None)],
    15: [(5.0, "thermal", None), (6.0, "thermal", None)],
    20: [(0.2, "health_failed", None), (15.0, "software", None)],
    42: [(25.0, "gpu_lost", "0")],
}
YOUNG = {7: 3.0}
HISTORY_DAYS = 40.0
# a fleet whose GPU faults show no spread beyond Poisson noise (40 nodes once, one twice):
# the moments give the prior no spread, and only its floor keeps the repeat from tying
FLAT: dict[int, list[tuple[float, str, str | None]]] = {
    n: [(10.0, "xid", "0")] + ([(12.0, "xid", "0")] if n == 40 else []) for n in range(41)}


def fleet_events(fleet=FLEET) -> list[Event]:
    out = [Event(T - age * DAY, INSTANCE.format(n), kind, gpu)
           for n, evs in fleet.items() for age, kind, gpu in evs]
    return sorted(out, key=lambda e: e.time)


def _windows(ages: list[float]) -> dict[str, int]:
    return {w: sum(a < length for a in ages) for w, length in WINDOWS}


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
        evs = fleet.get(n, [])
        for kind in sorted({k for _, k, _ in evs}):
            for w, c in _windows([a for a, k, _ in evs if k == kind]).items():
                if c or n == 3:  # node 3 exports its zero windows, the others leave them out
                    out.append({"series": f'gpu_node_episodes{{instance="{inst}", job="gpu", '
                                f'kind="{kind}", window="{w}"}}', "values": f"{c}x40"})
        for gpu in sorted({g for _, _, g in evs if g is not None}):
            for kind in sorted({k for _, k, g in evs if g == gpu}):
                for w, c in _windows([a for a, k, g in evs if k == kind and g == gpu]).items():
                    if c:
                        out.append({"series": f'gpu_episodes{{instance="{inst}", job="gpu", '
                                    f'gpu="{gpu}", uuid="GPU-{n}-{gpu}", kind="{kind}", '
                                    f'window="{w}"}}', "values": f"{c}x40"})
    return out


def _reasons(fleet, n: int, gpu: str | None, model: Model) -> str:
    kinds = {}
    for age, kind, g in fleet.get(n, []):
        if age < 28 and (gpu is None or g == gpu) and GROUP_OF[kind] in model.groups:
            kinds[kind] = kinds.get(kind, 0) + 1
    return "".join(f"{k} {c} in 28 d; " for k, c in sorted(kinds.items(), key=lambda x: (-x[1], x[0])))


def _expected(fleet, young, model: Model):
    """The command's ranking of the fleet, and its scores as input series."""
    start = T - HISTORY_DAYS * DAY
    # the young node keeps its own history start, as its gpu_node_history_start says
    ranking = rank(fleet_events(fleet), T, start, NODES, GPUS, model, starts={
        INSTANCE.format(n): T - d * DAY for n, d in young.items()})
    # the command's scores travel as input series; the rules' must match each within
    # 0.1 % (promtool evaluates the groups in no fixed order, so a rule may read its
    # input from one evaluation earlier: the young node's exposure moves 1 minute)
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


WHAT = ("the cluster's average (the lemon score: its episodes of the last 28 days against the "
        "fleet's rate per kind group, among the top 1 % of the cluster). Episodes: ")


def _node_alert(fleet, top, model: Model) -> dict:
    return {"eval_time": "30m", "alertname": "GpuNodeLemon", "exp_alerts": [{
        "exp_labels": {"instance": top.key, "job": "gpu", "severity": "warning"},
        "exp_annotations": {
            "summary": f"Node {top.key} is a lemon: it fails {top.score:.1f}x as often as its fleet",
            "description": f"Node {top.key} fails {top.score:.1f} times as often as "
                           + WHAT + _reasons(fleet, int(top.key[5:7]), None, model),
            "runbook_url": RUNBOOK + "gpunodelemon"}}]}


def tests_file(model: Model) -> dict:
    ranking, node_labels, gpu_labels, expected = _expected(FLEET, YOUNG, model)
    flat, flat_nodes, flat_gpus, flat_expected = _expected(FLAT, {}, model)
    top = ranking.nodes[0]
    best_gpu = max(((node, g, s) for node, gs in ranking.gpus.items() for g, s in gs),
                   key=lambda x: x[2].score)
    gn = int(best_gpu[0][5:7])
    old = {3: [(29.0, "ecc_dbe", "1")]}  # only an episode past every window
    return {
        "rule_files": ["../lemons.yml", "../global-lemons.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", "name": "lemon scores: the rules rank as the lemons command",
             "input_series": _series(FLEET, YOUNG) + expected,
             "promql_expr_test": _agree(node_labels, gpu_labels),
             "alert_rule_test": [
                 _node_alert(FLEET, top, model),
                 {"eval_time": "30m", "alertname": "GpuLemon", "exp_alerts": [{
                     "exp_labels": {"instance": best_gpu[0], "job": "gpu", "gpu": best_gpu[1],
                                    "uuid": f"GPU-{gn}-{best_gpu[1]}", "severity": "warning"},
                     "exp_annotations": {
                         "summary": f"GPU {best_gpu[1]} on {best_gpu[0]} is a lemon: it fails "
                                    f"{best_gpu[2].score:.1f}x as often as its fleet",
                         "description": f"GPU {best_gpu[1]} on {best_gpu[0]} fails "
                                        f"{best_gpu[2].score:.1f} times as often as "
                                        + WHAT + _reasons(FLEET, gn, best_gpu[1], model),
                         "runbook_url": RUNBOOK + "gpulemon"}}]},
                 {"eval_time": "10m", "alertname": "GpuNodeLemon", "exp_alerts": []},
             ]},
            {"interval": "1m",
             "name": "lemon scores without a spread: the prior's floor ranks the repeat first",
             "input_series": _series(FLAT, {}) + flat_expected,
             "promql_expr_test": _agree(flat_nodes, flat_gpus),
             "alert_rule_test": [_node_alert(FLAT, flat.nodes[0], model)]},
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
                  "# gpu_episodes) weighed by age per kind group, and the decayed time it was watched.\n"
                  "# Written by scripts/build_lemon_rules.py from exporter/analysis/lemons.py: edit those.\n",
    "global-lemons.yml": "# The lemon score, global half: the fleet's gamma prior per kind group (moments over\n"
                         "# every member of the cluster), each member's posterior rate against the fleet's, and\n"
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
