"""Profiles and selection files: what each serves, what each reads, and how a bad file
is refused. The series targets are measured on the 8-GPU fake node (docs/performance.md)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from exporter.cli import main
from exporter.families import FULL, MINIMAL, PROFILES, STANDARD
from exporter.gpu import fields as fi
from exporter.gpu.device_read import ALL_LINKS, NvlinkReads, device_read_requests
from exporter.metrics.family_table import LABELS, PROFILE
from exporter.metrics.render import render
from exporter.metrics.selection import Selection, load_selection
from exporter.sim import ib_tree
from exporter.yamlfile import ConfigError
from tests.test_docs_metrics import documented
from tests.tools import REPO, samples

GPUS = 8
HCAS = 8  # one NDR port per GPU, as on an H100/H200 training node


# -- the table, the docs and what the rules and dashboards query --------------------------

def _docs_section(title: str) -> set[str]:
    text = (REPO / "docs" / "metrics.md").read_text()
    body = text.split(f"### {title}\n\n", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"`([A-Za-z0-9_]+)`", body))


def test_every_documented_family_has_a_profile_and_the_docs_say_which():
    assert set(documented()) == set(PROFILE)
    assert _docs_section("Families in `minimal`") == {
        n for n, p in PROFILE.items() if p == MINIMAL}
    assert _docs_section("Families only in `full`") == {
        n for n, p in PROFILE.items() if p == FULL}
    assert set(PROFILE.values()) <= set(PROFILES)


def _queries() -> list[str]:
    """Every expression of the rules in alerts/ and every query of the dashboards."""
    found = [rule["expr"] for path in sorted((REPO / "alerts").glob("*.yml"))
             for group in yaml.safe_load(path.read_text())["groups"]
             for rule in group["rules"]]

    def walk(node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query") and isinstance(value, str):
                    found.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in sorted((REPO / "dashboards").glob("*.json")):
        walk(json.loads(path.read_text()))
    return found


def used_families() -> set[str]:
    """The families the rules and dashboards query: every identifier of their
    expressions that names one (a histogram's _bucket, _sum and _count name theirs);
    recording rules' outputs contain a colon and are no family."""
    used = set()
    for expr in _queries():
        for token in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", token)
            for name in (token, base):
                if name in PROFILE:
                    used.add(name)
    return used


def test_standard_serves_every_family_the_rules_and_dashboards_query():
    used = used_families()
    assert len(used) > 100  # the derivation finds them (else this test could not fail)
    assert {"gpu_power_watts", "gpu_nvlink_errors_total", "gpu_node_power_swing_active",
            "infiniband_port_link_downed_total"} <= used
    standard = Selection(STANDARD)
    assert sorted(n for n in used if not standard.wants(n)) == []
    # and a profile that drops one of them is caught by the same check
    assert not all(Selection(MINIMAL).wants(n) for n in used)


def test_a_label_the_dashboards_group_by_is_not_summed_away_at_standard():
    standard = Selection(STANDARD)
    for expr in _queries():
        for names, labels in re.findall(r"by \(([^)]*)\) \(\w*\(?(\w+)", expr):
            dropped = set(standard.without(labels)) & {x.strip() for x in names.split(",")}
            assert not dropped, f"{expr}: {dropped}"


# -- series per profile on the 8-GPU fake node -------------------------------------------

@pytest.fixture(scope="module")
def node_snapshot(module_exporter):
    """The 8-GPU fake node as `run --fake` serves it (its host collector on; no
    InfiniBand here)."""
    exp = module_exporter.start(manual=True, metrics_profile=FULL, collector_host=True)
    exp.sampler.advance(40)
    return exp.sampler.build_snapshot()


@pytest.fixture(scope="module")
def fabric_snapshot(module_exporter, tmp_path_factory):
    """The same node with an NDR port per GPU."""
    sysfs = tmp_path_factory.mktemp("sysfs")
    for hca in range(HCAS):
        ib_tree.ndr_hca(sysfs, f"mlx5_{hca}")
    exp = module_exporter.start(manual=True, metrics_profile=FULL, path_sysfs=str(sysfs),
                                collector_infiniband=True, collector_host=True)
    exp.sampler.advance(40)
    return exp.sampler.build_snapshot()


def series(snapshot, profile: str) -> tuple[int, int]:
    """(series with a gpu label, series without) of a profile's exposition."""
    lines = [line for line in render(snapshot, selection=Selection(profile)).decode()
             .splitlines() if line and not line.startswith("#")]
    per_gpu = sum(1 for line in lines if '{gpu="' in line or ',gpu="' in line)
    return per_gpu, len(lines) - per_gpu


def test_series_per_profile_are_within_their_targets(node_snapshot):
    assert node_snapshot.gpu_count == GPUS
    counts = {profile: series(node_snapshot, profile) for profile in PROFILES}
    per_gpu, node = counts[STANDARD]
    assert per_gpu <= 100 * GPUS and node <= 200, counts
    assert per_gpu + node <= 1000, counts
    assert counts[MINIMAL][0] <= 30 * GPUS, counts
    total = {profile: sum(pair) for profile, pair in counts.items()}
    assert total[MINIMAL] < total[STANDARD] < total[FULL], total
    assert counts[FULL][0] > 200 * GPUS  # NVLink per link: the size the profiles cut


def test_a_port_per_gpu_adds_no_more_to_standard_than_a_gpu_does(node_snapshot,
                                                                 fabric_snapshot):
    alone, with_ports = (sum(series(s, STANDARD)) for s in (node_snapshot, fabric_snapshot))
    assert 0 < with_ports - alone <= 25 * HCAS
    minimal = sum(series(fabric_snapshot, MINIMAL)) - sum(series(node_snapshot, MINIMAL))
    assert 0 < minimal <= 10 * HCAS


def test_standard_sums_nvlink_counters_over_the_links(node_snapshot):
    full = samples(render(node_snapshot, selection=Selection(FULL)))
    standard = samples(render(node_snapshot, selection=Selection(STANDARD)))
    for name in ("gpu_nvlink_errors_total", "gpu_nvlink_transmit_bytes_total"):
        assert all("link" in s.labels for s in full[name])
        assert all("link" not in s.labels for s in standard[name])
        for gpu in ("0", "7"):
            want = sum(s.value for s in full[name] if s.labels["gpu"] == gpu)
            got = sum(s.value for s in standard[name] if s.labels["gpu"] == gpu)
            assert got == pytest.approx(want, rel=1e-9)
    assert "gpu_nvlink_link_up" in full and "gpu_nvlink_link_up" not in standard


# -- what is read ----------------------------------------------------------------------

def test_a_selection_reads_only_the_nvlink_fields_its_families_need():
    every = device_read_requests(18)
    assert Selection(FULL).nvlink_reads() == NvlinkReads()
    standard = device_read_requests(18, Selection(STANDARD).nvlink_reads())
    assert (fi.NVLINK_TX, ALL_LINKS) in standard and (fi.NVLINK_TX, 3) not in standard
    assert len(standard) == len(every) - 2 * 18 + 2
    minimal = device_read_requests(18, Selection(MINIMAL).nvlink_reads())
    assert not any(f in (fi.NVLINK_TX, fi.NVLINK_RX) for f, _ in
                   (r for r in minimal if isinstance(r, tuple)))
    nothing = Selection(FULL, exclude=("gpu_nvlink_*", "gpu_*health_*")).nvlink_reads()
    assert device_read_requests(18, nothing) == device_read_requests(0)
    # the health verdict's NVLink checks keep the link states and errors read
    judged = Selection(FULL, exclude=("gpu_nvlink_*",)).nvlink_reads()
    assert (judged.state, judged.errors, judged.traffic) == (True, True, False)


def test_traffic_read_for_all_links_is_the_sum_of_the_links(running_exporter):
    per_link = running_exporter.start(manual=True, metrics_profile=FULL)
    summed = running_exporter.start(manual=True, metrics_profile=STANDARD)
    for exp in (per_link, summed):
        exp.sampler.advance(12)
    full = samples(render(per_link.sampler.build_snapshot(), selection=Selection(FULL)))
    standard = samples(summed.current.body)
    assert len(standard["gpu_nvlink_transmit_bytes_total"]) == GPUS
    for name in ("gpu_nvlink_transmit_bytes_total", "gpu_nvlink_receive_bytes_total"):
        want = sum(s.value for s in full[name] if s.labels["gpu"] == "2")
        got = [s.value for s in standard[name] if s.labels["gpu"] == "2"]
        assert got == [pytest.approx(want, rel=1e-9)]
    assert summed.sampler.sweep.nvlink_reads.traffic_per_link is False


# -- selection files ---------------------------------------------------------------------

def _file(tmp_path, text: str) -> str:
    path = tmp_path / "metrics.yml"
    path.write_text(text)
    return str(path)


def test_a_selection_file_includes_excludes_and_aggregates(tmp_path, node_snapshot):
    path = _file(tmp_path, """
include: [gpu_nvlink_link_up, "gpu_window_*"]
exclude: ["host_*", gpu_window_throttle_ratio]
aggregate:
  - families: gpu_clock_event_active
    without: [reason]
""")
    selection = load_selection(STANDARD, path)
    got = samples(render(node_snapshot, selection=selection))
    assert len(got["gpu_nvlink_link_up"]) == GPUS * 18
    assert "gpu_window_utilization_ratio" in got and "gpu_window_throttle_ratio" not in got
    assert not any(name.startswith("host_") for name in got)
    active = got["gpu_clock_event_active"]
    assert len(active) == GPUS and all("reason" not in s.labels for s in active)
    assert selection.describe().startswith(f"profile standard with {path}")


@pytest.mark.parametrize(("text", "error"), [
    ("include: [gpu_powr_watts]\n",
     r"metrics.yml:1: include: item 1: 'gpu_powr_watts': unknown family \(did you mean "
     r"gpu_power_watts\?\)"),
    ("\nexclude:\n  - host_load1\n  - gpu_nvlink_link_upp\n",
     r"metrics.yml:4: exclude: item 2: 'gpu_nvlink_link_upp': unknown family \(did you mean "
     r"gpu_nvlink_link_up\?\)"),
    ("exclude: ['dcgm_*']\n", r"metrics.yml:1: exclude: item 1: 'dcgm_\*' matches no family"),
    ("exclude: 3\n", r"metrics.yml:1: exclude: expected a list of family names or globs"),
    ("include: [7]\n", r"include: item 1: expected a family name or glob, got 7"),
    ("includes: [gpu_up]\n", r"metrics.yml:1: includes: unknown key \(did you mean include\?\)"),
    ("- gpu_up\n", r"metrics.yml: expected a mapping, got list"),
    ("aggregate:\n  - families: gpu_up\n", r"aggregate\[1\]: without is missing"),
    ("aggregate:\n  - families: gpu_up\n    without: ['bad-label']\n",
     r"metrics.yml:3: aggregate\[1\].without: expected one or more label names"),
    ("aggregate:\n  - families: gpu_upp\n    without: gpu\n",
     r"metrics.yml:2: aggregate\[1\].families: item 1: 'gpu_upp': unknown family"),
    ("aggregate: {families: gpu_up}\n", r"aggregate: expected a list"),
    # an aggregation that would do nothing: the family has no such label
    ("aggregate:\n  - families: gpu_power_watts\n    without: [link]\n",
     r"metrics.yml:3: aggregate\[1\].without: 'link' is not a label of gpu_power_watts "
     r"\(its labels: gpu, uuid\)$"),
    ("\naggregate:\n  - families: [gpu_nvlink_errors_total, gpu_up]\n"
     "    without: link\n",
     r"metrics.yml:4: aggregate\[1\].without: 'link' is not a label of gpu_up"),
    ("aggregate:\n  - families: 'host_*'\n    without: [gpu, cpu]\n",
     r"metrics.yml:3: aggregate\[1\].without: 'gpu' is a label of none of the \d+ families "
     r"'host_\*' matches"),
    ("aggregate:\n  - families: gpu_nvlink_errors_total\n    without: [link, lnk]\n",
     r"aggregate\[1\].without: 'lnk' is not a label of gpu_nvlink_errors_total"),
    ("include: [gpu_up\n", r"metrics.yml:2: invalid YAML"),
])
def test_a_bad_selection_file_is_refused_with_file_line_and_reason(tmp_path, text, error):
    with pytest.raises(ConfigError, match=error):
        load_selection(STANDARD, _file(tmp_path, text))


def test_a_glob_may_sum_away_a_label_some_of_its_families_have(tmp_path):
    """gpu_nvlink_* matches gpu_nvlink_links_active (no link label) and the per-link
    counters: fine, as `sum without (link)` over them would be."""
    selection = load_selection(FULL, _file(
        tmp_path, "aggregate:\n  - families: 'gpu_nvlink_*'\n    without: [link]\n"))
    assert selection.without("gpu_nvlink_errors_total") == ("link",)
    assert selection.without("gpu_nvlink_links_active") == ("link",)  # a no-op there


def test_the_label_table_is_the_documented_one():
    """What the check reads (exporter.metrics.family_table) and docs/metrics.md's label
    column (which tests/test_docs_metrics.py holds to what is served): after changing a
    family, `.venv/bin/python scripts/build_metrics_docs.py` writes both again."""
    docs = documented()
    assert set(LABELS) == set(PROFILE) == set(docs)
    wrong = {name: (LABELS[name], docs[name][1]) for name in docs
             if set(LABELS[name]) != docs[name][1]}
    assert not wrong, wrong


def test_an_unknown_profile_is_refused():
    with pytest.raises(ConfigError, match="expected one of minimal, standard, full"):
        load_selection("everything")


def test_check_config_validates_the_selection_file(tmp_path, capsys):
    selection = _file(tmp_path, "exclude: [gpu_powr_watts]\n")
    config = tmp_path / "config.yml"
    config.write_text(f"metrics_profile: minimal\nmetrics_file: {selection}\n")
    assert main(["check-config", str(config)]) != 0
    err = capsys.readouterr().err
    assert "metrics.yml:1: exclude: item 1" in err and "did you mean gpu_power_watts" in err
    (tmp_path / "metrics.yml").write_text("exclude: [gpu_power_watts]\n")
    assert main(["check-config", str(config)]) == 0
    assert "metrics: profile minimal with" in capsys.readouterr().out
    (tmp_path / "metrics.yml").write_text(
        "aggregate:\n  - families: gpu_power_watts\n    without: [link]\n")
    assert main(["check-config", str(config)]) == 2  # was "ok (1 aggregation(s))"
    assert capsys.readouterr().err.strip().endswith(
        "metrics.yml:3: aggregate[1].without: 'link' is not a label of gpu_power_watts "
        "(its labels: gpu, uuid)")
    config.write_text("metrics_profile: most\n")
    assert main(["check-config", str(config)]) != 0
    assert "config.yml:1: metrics_profile: expected one of minimal, standard, full" in (
        capsys.readouterr().err)


def test_a_reload_applies_a_new_selection(running_exporter, tmp_path):
    from exporter.service import reload

    path = _file(tmp_path, "exclude: [gpu_temperature_celsius]\n")
    exp = running_exporter.start(manual=True)
    exp.sampler.advance(6)
    assert "gpu_temperature_celsius" in samples(exp.current.body)
    config = tmp_path / "config.yml"
    config.write_text(f"fake: true\nmetrics_profile: full\nmetrics_file: {path}\n")
    assert reload(exp, str(config), {"listen_address": "127.0.0.1:0"})
    assert exp.sampler.sweep.nvlink_reads == NvlinkReads()  # per link again at full
    exp.sampler.advance(6)
    got = samples(exp.current.body)
    assert "gpu_temperature_celsius" not in got and "gpu_nvlink_link_up" in got
    (tmp_path / "metrics.yml").write_text("exclude: [nonsense]\n")
    assert not reload(exp, str(config), {"listen_address": "127.0.0.1:0"})
    assert exp.selection.exclude == ("gpu_temperature_celsius",)  # the old one stays


def test_a_driver_without_the_all_links_total_gets_the_links_summed(monkeypatch):
    from exporter.gpu.backend import NvmlBackend
    from exporter.gpu.device_read import read_device
    from exporter.sampling.clock import ManualClock
    from exporter.sim import fake
    from exporter.sim.scenarios import load_scenario

    clock = ManualClock(1_790_000_000.0)
    with fake.installed(load_scenario("training"), clock, costs=None) as lib:
        backend = NvmlBackend()
        backend.open()
        clock.advance(30)
        per_link = read_device(backend, 0, 18, clock.time(), {})
        summed = read_device(backend, 0, 18, clock.time(), {},
                             Selection(STANDARD).nvlink_reads())
        field = lib._field
        monkeypatch.setattr(lib, "_field", lambda gpu, fid, scope, t: None
                            if scope == ALL_LINKS else field(gpu, fid, scope, t))
        fallback = read_device(backend, 1, 18, clock.time(), {},
                               Selection(STANDARD).nvlink_reads())
        per_link_1 = read_device(backend, 1, 18, clock.time(), {})
        backend.close()
    want = sum(link.transmit_bytes for link in per_link.nvlinks)
    assert summed.nvlink_traffic[0] == pytest.approx(want, rel=1e-9)
    assert all(link.transmit_bytes is None for link in summed.nvlinks)
    want_1 = sum(link.receive_bytes for link in per_link_1.nvlinks)
    assert fallback.nvlink_traffic[1] == pytest.approx(want_1, rel=1e-9)


def _alerts_served_by(selection: Selection) -> set[str]:
    """The alerts every family of whose expression (through the recording rules it
    uses) the selection serves."""
    rules = [rule for path in sorted((REPO / "alerts").glob("*.yml"))
             for group in yaml.safe_load(path.read_text())["groups"]
             for rule in group["rules"]]
    recorded = {rule["record"]: rule["expr"] for rule in rules if "record" in rule}

    def families(expr: str, seen: frozenset = frozenset()) -> set[str]:
        found = set()
        for token in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
            if token in PROFILE:
                found.add(token)
            elif token in recorded and token not in seen:
                found |= families(recorded[token], seen | {token})
        return found

    return {rule["alert"] for rule in rules if "alert" in rule
            and all(selection.wants(name) for name in families(rule["expr"]))}


def test_the_docs_name_the_alerts_minimal_serves():
    every = _alerts_served_by(Selection(FULL))
    assert _alerts_served_by(Selection(STANDARD)) == every
    assert _docs_section("Alerts at `minimal`") == _alerts_served_by(Selection(MINIMAL))
    assert _alerts_served_by(Selection(MINIMAL)) < every


def test_a_collector_whose_families_are_all_left_out_is_not_started(running_exporter,
                                                                    tmp_path):
    sysfs = tmp_path / "sysfs"
    ib_tree.ndr_hca(sysfs)
    path = _file(tmp_path, 'exclude: ["infiniband_*"]\n')
    common = {"path_sysfs": str(sysfs), "collector_infiniband": True, "collector_host": True}
    every = running_exporter.start(manual=True, **common)
    fewer = running_exporter.start(manual=True, metrics_file=path, **common)
    assert {"infiniband", "host"} <= {c.name for c in every.collectors}
    names = {c.name for c in fewer.collectors}
    assert "infiniband" not in names and "host" in names
    fewer.sampler.advance(6)
    assert not any(name.startswith(("infiniband_", "cte_infiniband_"))
                   for name in samples(fewer.current.body))
    assert Selection(STANDARD, exclude=("host_*",)).needs_collector("host") is False
    assert Selection(STANDARD).needs_collector("host")
    assert Selection(MINIMAL, exclude=("gpu_hpc_job_info",)).needs_collector("jobs")
