"""Every rule sits where it may run: node-local files (safe on any scrape shard) hold no
rule that needs more than one node's series; alerts/global-*.yml hold the rules that do."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.rule_scope import cross_node_reasons, selects_series
from tests.tools import REPO, require_binary

ALERTS = REPO / "alerts"
GLOBAL_FILES = sorted(ALERTS.glob("global-*.yml"))
NODE_FILES = sorted(set(ALERTS.glob("*.yml")) - set(GLOBAL_FILES))


def _rules(files) -> list[tuple[str, str, dict]]:
    return [(path.name, group["name"], rule) for path in files
            for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def _global_series() -> set[str]:
    return {rule["record"] for _, _, rule in _rules(GLOBAL_FILES) if "record" in rule}


def _name(rule: dict) -> str:
    return rule.get("record") or rule["alert"]


def test_both_kinds_of_file_exist():
    assert len(NODE_FILES) >= 5 and len(GLOBAL_FILES) >= 3, (NODE_FILES, GLOBAL_FILES)
    assert all(_rules([path]) for path in NODE_FILES + GLOBAL_FILES)


def test_node_local_groups_hold_no_cross_node_rule():
    wrong = {f"{file} / {group} / {_name(rule)}": reasons
             for file, group, rule in _rules(NODE_FILES)
             if (reasons := cross_node_reasons(rule["expr"], _global_series()))}
    assert wrong == {}


def test_global_groups_hold_only_rules_that_need_them():
    """A node-local rule in a global group would only load the central ruler (constants,
    such as the swing threshold the global alert reads, are fine there)."""
    misplaced = [f"{file} / {group} / {_name(rule)}" for file, group, rule in _rules(GLOBAL_FILES)
                 if selects_series(rule["expr"])
                 and not cross_node_reasons(rule["expr"], _global_series())]
    assert misplaced == []


def test_group_names_are_unique_across_files():
    names = [group["name"] for path in ALERTS.glob("*.yml")
             for group in yaml.safe_load(path.read_text())["groups"]]
    assert len(names) == len(set(names)), names


@pytest.mark.parametrize("expr", [
    "gpu_straggler == 1",
    "max by (cluster, job, instance, hpc_job) (gpu_hpc_job_info)",
    "sum(gpu_power_watts) by (instance, gpu)",
    "sum without (gpu) (gpu_power_watts)",
    'count_values without () ("bucket", round(x))',
    "a * on (cluster, job, instance, gpu, uuid) group_left () b",
    "a / ignoring (gpu) b",
    'label_replace(x, "signal", "power", "", "") or y',
    "increase(gpu_node_power_ramps_total[5m]) > 0",
    "foo:sum > 1  # sum by (cluster) in a comment",
    'x{reason="sum by (cluster) (y)"}',
])
def test_node_local_expressions(expr):
    assert cross_node_reasons(expr) == []


@pytest.mark.parametrize(("expr", "reason"), [
    ("sum by (cluster) (gpu_power_watts)", "sum by (cluster) drops instance"),
    ("sum(gpu_power_watts) by (cluster, hpc_job)", "sum by (cluster, hpc_job) drops instance"),
    ("avg(x)", "avg every label dropped drops instance"),
    ("max without (instance) (x)", "max without (instance) drops instance"),
    ("quantile by (cluster, hpc_job, signal) (0.5, x)", "quantile by (cluster, hpc_job, signal)"),
    ("a / on (cluster) group_left () b", "on (cluster) matches across nodes"),
    ("a and on () b", "on () matches across nodes"),
    ("a > ignoring (instance, gpu) b", "ignoring (instance, gpu) matches across nodes"),
    ("x - scalar(y)", "scalar() mixes every series"),
    ("absent(up)", "absent() mixes every series"),
])
def test_cross_node_expressions(expr, reason):
    reasons = cross_node_reasons(expr)
    assert any(r.startswith(reason) for r in reasons), reasons


def test_reading_a_global_series_is_global():
    assert cross_node_reasons("hpc_job:gpu_window_feature:median > 1",
                              {"hpc_job:gpu_window_feature:median"}) == [
        "reads hpc_job:gpu_window_feature:median, recorded by a global rule"]
    assert cross_node_reasons("hpc_job:gpu_window_feature:median_2 > 1",
                              {"hpc_job:gpu_window_feature:median"}) == []


def test_constants_select_no_series():
    assert not selects_series("vector(2000000)")
    assert not selects_series("time() - 5")
    assert selects_series('cluster:x{cluster!=""} > 1')
    assert selects_series("sum by (cluster) (rate(y[5m]))")


@pytest.mark.parametrize("expr", ["sum(x", "x)", "sum by (cluster) ((x)"])
def test_unbalanced_expressions_are_rejected(expr):
    with pytest.raises(ValueError, match="unbalanced"):
        cross_node_reasons(expr)


def test_vmalert_loads_every_rule_file():
    """The same files run in vmalert (MetricsQL parses every expression and template)."""
    vmalert = require_binary("vmalert")
    result = subprocess.run([vmalert, "-dryRun", f"-rule={ALERTS}/*.yml",
                             "-rule.validateExpressions", "-rule.validateTemplates"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    bad = [x for x in (result.stdout + result.stderr).splitlines() if "error" in x.lower()]
    assert bad == []
