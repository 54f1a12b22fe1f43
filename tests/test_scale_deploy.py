"""deploy/scale: the unit files and settings hang together (tests/test_e2e_scale.py runs them)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from bench.scale_stack import SCALE, exec_start, read_env
from tests.tools import REPO, require_binary

ENV = read_env(SCALE / "scale.env")
UNITS = sorted(SCALE.glob("*.service"))


def _flags(unit: str, instance: str = "0") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for arg in exec_start(SCALE / unit, ENV, instance)[1:]:
        key, _, value = arg.lstrip("-").partition("=")
        out.setdefault(key, []).append(value)
    return out


@pytest.fixture(autouse=True)
def _binaries():
    for name in ("victoria-metrics", "vmagent", "vmalert"):
        require_binary(name)


def test_every_unit_resolves_from_scale_env():
    assert {u.name for u in UNITS} == {"victoria-metrics.service", "vmagent@.service",
                                       "vmalert-node.service", "vmalert-global.service"}
    for unit in UNITS:
        argv = exec_start(unit, ENV, "1")
        assert not any("${" in a or "%i" in a for a in argv), argv
        assert "EnvironmentFile=/etc/cluster-telemetry-exporter/scale/scale.env" in (
            unit.read_text())


def test_shards_split_by_membership_and_the_store_dedups_their_pairs():
    agent = _flags("vmagent@.service", "3")
    assert agent["promscrape.cluster.memberNum"] == ["3"]
    assert agent["promscrape.cluster.membersCount"] == [ENV["SHARDS"]]
    assert agent["promscrape.cluster.replicationFactor"] == [ENV["REPLICATION"]] == ["2"]
    assert agent["remoteWrite.url"] == [ENV["VM_URL"] + "/api/v1/write"]
    store = _flags("victoria-metrics.service")
    assert store["dedup.minScrapeInterval"] == [ENV["SCRAPE_INTERVAL"]]
    assert store["retentionPeriod"] == ["30d"]
    scrape = yaml.safe_load((SCALE / "scrape.yml").read_text())
    assert scrape["global"]["scrape_interval"] == ENV["SCRAPE_INTERVAL"]


def test_the_two_rulers_load_every_rule_file_once():
    node = [r.removeprefix(ENV["RULES_DIR"] + "/") for r in _flags("vmalert-node.service")["rule"]]
    (pattern,) = _flags("vmalert-global.service")["rule"]
    assert pattern == ENV["RULES_DIR"] + "/global-*.yml"
    global_files = {p.name for p in (REPO / "alerts").glob("global-*.yml")}
    all_files = {p.name for p in (REPO / "alerts").glob("*.yml")}
    assert len(node) == len(set(node)) and set(node) | global_files == all_files
    assert not set(node) & global_files
    for unit in ("vmalert-node.service", "vmalert-global.service"):
        flags = _flags(unit)
        assert flags["datasource.url"] == flags["remoteWrite.url"] == [ENV["VM_URL"]], unit
        assert flags["notifier.url"] == [ENV["ALERTMANAGER_URL"]], unit


def test_the_scrape_config_loads_in_vmagent(tmp_path):
    shutil.copytree(SCALE, tmp_path / "scale")
    result = subprocess.run([require_binary("vmagent"), "-dryRun",
                             f"-promscrape.config={tmp_path / 'scale' / 'scrape.yml'}"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_bad_env_line_or_unknown_setting_is_an_error(tmp_path):
    bad = tmp_path / "scale.env"
    bad.write_text("SHARDS=2\nnot a setting\n")
    with pytest.raises(ValueError, match="scale.env:2: not KEY=VALUE"):
        read_env(bad)
    env = dict(ENV)
    del env["VM_URL"]
    with pytest.raises(KeyError, match="VM_URL"):
        exec_start(SCALE / "vmagent@.service", env, "0")
