"""deploy/scale: the unit files and settings hang together (tests/test_e2e_scale.py runs them)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from bench.scale_stack import SCALE, exec_start, read_env
from bench.unit_sandbox import DEVICES, sandboxed, service_settings, unknown_options
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


def test_the_end_to_end_test_places_every_hardening_option_of_every_unit():
    for unit in UNITS:
        assert unknown_options(unit) == [], unit.name
        settings = service_settings(unit)
        assert settings["ProtectSystem"] == ["strict"] and settings["NoNewPrivileges"] == ["yes"]


def test_a_new_hardening_option_stops_the_start(tmp_path):
    unit = tmp_path / "x.service"
    unit.write_text((SCALE / "vmalert-node.service").read_text().replace(
        "[Service]\n", "[Service]\nPrivateNetwork=yes\n"))
    with pytest.raises(ValueError, match=r"x.service: .* cannot place: \['PrivateNetwork'\]"):
        sandboxed(unit, ["true"], None)


PROBE = ("touch {outside}/file 2>/dev/null || echo outside-read-only; "
         "touch {state}/file 2>/dev/null && echo state-written; echo devices: $(ls /dev); "
         "grep -E '^(CapEff|CapBnd|NoNewPrivs|Umask):' /proc/self/status")


@pytest.mark.parametrize("name", ["victoria-metrics.service", "vmagent@.service",
                                  "vmalert-node.service"])
def test_a_unit_runs_read_only_but_for_its_state_without_privileges(tmp_path, name):
    outside, state = tmp_path / "outside", tmp_path / "data"
    outside.mkdir()
    script = PROBE.format(outside=outside, state=state)
    result = subprocess.run(sandboxed(SCALE / name, ["sh", "-c", script], state),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "outside-read-only" in lines and not (outside / "file").exists(), result.stdout
    # only the store and the shards have a state directory; the rulers write nothing
    writes_state = "StateDirectory" in service_settings(SCALE / name)
    assert ("state-written" in lines) == writes_state == (state / "file").exists(), lines
    # the six basic devices and nothing else (no disks, no kmsg, no pts)
    assert f"devices: {' '.join(sorted(DEVICES))}" in lines
    status = dict(line.split(":\t") for line in lines if ":\t" in line)
    assert status == {"CapEff": "0000000000000000", "CapBnd": "0000000000000000",
                      "NoNewPrivs": "1", "Umask": "0077"}
