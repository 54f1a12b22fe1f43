"""The lemon score: InfiniteHBD's Desc table, the score's pieces, the `lemons` command and
its bad input, and the rules generated from the same code."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time

import pytest

from exporter.analysis.lemons import GROUP_OF, GROUPS, Member, Model, counted, score_fleet
from exporter.cli import main
from exporter.commands.lemons import rank
from exporter.events import KINDS, Event
from exporter.offline.infinitehbd import (
    CLASS_KINDS,
    DAY,
    DESC_KINDS,
    EPOCH,
    load_faults,
    to_events,
)
from tests.tools import REPO

_SHARED = (REPO.parent / "shared", REPO.parent.parent / "shared")
_TRACE = "data/ew/InfiniteHBD-Trace/fault_trace.json"
FAULT_TRACE = next((s / _TRACE for s in _SHARED if (s / _TRACE).exists()), _SHARED[0] / _TRACE)
needs_trace = pytest.mark.skipif(not FAULT_TRACE.exists(),
                                 reason="shared/data is not beside the checkout")


# -- InfiniteHBD's Desc values -----------------------------------------------------------

@needs_trace
def test_the_table_accounts_for_every_desc_of_the_shared_trace():
    records = json.loads(FAULT_TRACE.read_text())
    pairs = {(r["fault_type"]["Class"], r["fault_type"]["Desc"]) for r in records}
    assert pairs <= set(DESC_KINDS), pairs - set(DESC_KINDS)
    descs = {r["fault_type"]["Desc"] for r in records}
    assert descs == {d for _, d in DESC_KINDS}  # no Desc left out, none invented
    faults = load_faults(FAULT_TRACE)
    events = to_events(faults)
    starts = [r for r in records if r["event_type"] == "fault_start"]
    assert len(events) == len(starts) == 372
    assert {e.node for e in events} == {r["node_id"] for r in starts}
    first = min(starts, key=lambda r: r["event_time"])
    assert events[0].time == pytest.approx(EPOCH + first["event_time"] * DAY)
    assert all(e.kind in KINDS for e in events)


@needs_trace
@pytest.mark.parametrize("flags", [[], ["--input-format", "infinitehbd"]])
def test_lemons_reads_the_trace_itself(capsys, flags):
    at = EPOCH + 100 * DAY
    assert main(["lemons", str(FAULT_TRACE), "--at", str(at), "--fleet-nodes", "400",
                 "--format", "json", *flags]) == 0
    nodes = json.loads(capsys.readouterr().out)["rankings"][0]["nodes"]
    events = to_events(load_faults(FAULT_TRACE))
    assert [(n["node"], n["score"]) for n in nodes] == [
        (s.key, float(f"{s.score:.6g}")) for s in rank(events, at, 400).nodes]
    assert nodes and all(n["score"] > 0 for n in nodes)


def _trace(tmp_path, records):
    path = tmp_path / "fault_trace.json"
    path.write_text(json.dumps(records, indent=1))
    return str(path)


def _record(t, cls, desc, level="Hardware Failure", event="fault_start"):
    return {"node_id": "n", "event_time": t, "event_type": event,
            "fault_type": {"Level": level, "Class": cls, "Desc": desc}}


def test_a_desc_the_table_lacks_takes_its_class_kind_and_is_named(tmp_path, capsys):
    trace = _trace(tmp_path, [_record(1.0, "GPU", "GPU on fire"),
                              _record(2.0, "GPU", "GPU on fire"),
                              _record(3.0, "Rack", "Door open"),
                              _record(4.0, "Cosmic", "Ray", level="Cosmic Failure"),
                              _record(5.0, "GPU", "GPU Lost")])
    faults = load_faults(trace)
    assert [f.kind for f in faults] == ["other_gpu", "other_gpu", "other_hardware", "unknown",
                                        "gpu_lost"]
    assert main(["lemons", trace, "--at", str(EPOCH + 6 * DAY)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4, err  # three fallbacks, and what was not counted
    assert all(line.startswith(f"cluster-telemetry-exporter: lemons: {trace}: ") for line in err)
    assert "not counted" in err[-1] and "other_hardware 1" in err[-1] and "unknown 1" in err[-1]
    assert any("Class 'GPU', Desc 'GPU on fire' is not in the table: 2 fault(s) as 'other_gpu'"
               in line for line in err)


def test_a_record_that_is_not_a_fault_is_refused_with_its_index(tmp_path, capsys):
    trace = _trace(tmp_path, [_record(1.0, "GPU", "y", event="fault_begin")])
    assert main(["lemons", trace, "--at", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "record 0: event_type 'fault_begin'" in err[0]


@needs_trace
def test_the_shared_trace_needs_no_fallback():
    assert all(f.in_table for f in load_faults(FAULT_TRACE))
    assert set(CLASS_KINDS) == {c for c, _ in DESC_KINDS}  # every Class the trace has


def test_the_docs_table_is_the_code_table():
    text = (REPO / "docs" / "health.md").read_text()
    section = text[text.index("## Lemon score"):]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \| `([a-z_]+)` \|", section, re.M)
    assert {(c, d): k for c, d, k in rows} == {key: kind for key, (kind, _) in DESC_KINDS.items()}
    for group, kinds in GROUPS.items():
        assert f"| `{group}` | " + ", ".join(f"`{k}`" for k in kinds) + " |" in section


def test_every_kind_is_in_one_group():
    assert set(GROUP_OF) == set(KINDS)
    assert sum(len(k) for k in GROUPS.values()) == len(KINDS)


# -- the score's pieces ------------------------------------------------------------------

def test_the_window_coefficients_weigh_each_episode_by_its_segment():
    model = Model(tau_days=7.0)
    w1, w7, w28 = model.segment_weights()
    assert 1 > w1 > w7 > w28 > 0
    # one episode 3 days old is in the 7 d and 28 d windows: it weighs w7
    assert model.decayed_count({"7d": 1, "28d": 1}) == pytest.approx(w7)
    assert model.decayed_count({"1d": 1, "7d": 1, "28d": 1}) == pytest.approx(w1)
    assert model.window_coefficients() == pytest.approx({"1d": w1 - w7, "7d": w7 - w28,
                                                         "28d": w28})
    assert Model(tau_days=math.inf).segment_weights() == (1.0, 1.0, 1.0)


MODEL = Model(tau_days=math.inf, kind_weights={"ecc_dbe": 0.2, "ib_link_down": 0.05})


def test_each_kind_weighs_what_it_foretold_and_a_kind_weighed_0_scores_nothing():
    members = [Member("dbe", {"ecc_dbe": {"28d": 1}}),
               Member("link", {"ib_link_down": {"28d": 1}}),
               Member("xids", {"xid": {"1d": 5, "7d": 5, "28d": 5}})]
    ranked = score_fleet(MODEL, members, 10)
    assert [s.key for s in ranked] == ["dbe", "link"]  # xid weighs 0 here: left out
    # against the fleet's mean, quiet members at 0: (0.2 + 0.05) / 10
    assert ranked[0].score == pytest.approx(0.2 / 0.025)
    assert ranked[1].score == pytest.approx(0.05 / 0.025)
    assert sum(s.score for s in ranked) == pytest.approx(10)  # the mean score is 1


def test_recent_repeats_score_higher_and_quiet_members_not_at_all():
    model = Model(tau_days=7.0, kind_weights={"ecc_dbe": 0.2})
    members = [Member("recent", {"ecc_dbe": {"1d": 2, "7d": 2, "28d": 2}}),
               Member("old", {"ecc_dbe": {"28d": 2}}),
               Member("once", {"ecc_dbe": {"7d": 1, "28d": 1}})]
    ranked = score_fleet(model, members, 100)
    scores = {s.key: s.score for s in ranked}
    assert ranked[0].key == "recent" and len(ranked) == 3  # the 97 quiet ones: left out
    assert scores["recent"] > scores["old"] > 0  # the same two episodes, older
    assert scores["once"] > 0
    assert ranked[0].reasons == ("ecc_dbe (2 in 1d, 2 in 7d, 2 in 28d): 100% of the score",)
    assert score_fleet(model, [], 100) == []


def test_the_reasons_give_each_kinds_share_largest_first():
    member = Member("n", {"ib_link_down": {"28d": 2}, "ecc_dbe": {"28d": 1}})
    (scored,) = score_fleet(MODEL, [member], 5)
    assert scored.reasons == ("ecc_dbe (0 in 1d, 0 in 7d, 1 in 28d): 67% of the score",
                              "ib_link_down (0 in 1d, 0 in 7d, 2 in 28d): 33% of the score")
    tiny = Member("t", {"ecc_dbe": {"28d": 1}, "unknown": {"28d": 1}})
    (scored,) = score_fleet(Model(kind_weights={"ecc_dbe": 1.0, "unknown": 0.001}), [tiny], 5)
    assert scored.reasons[1] == "unknown (0 in 1d, 0 in 7d, 1 in 28d): under 1% of the score"


def test_the_shipped_score_counts_the_gpu_kinds_episodes_in_28_days():
    shipped = Model()
    assert shipped.tau_days == math.inf and shipped.window_coefficients() == {
        "1d": 0.0, "7d": 0.0, "28d": 1.0}
    assert shipped.kinds == GROUPS["gpu"] and {shipped.weight(k) for k in shipped.kinds} == {1.0}
    members = [Member("two", {"ecc_dbe": {"1d": 1, "7d": 1, "28d": 1}, "xid": {"28d": 1}}),
               Member("one", {"gpu_lost": {"28d": 1}}),
               Member("links", {"ib_link_down": {"1d": 3, "7d": 3, "28d": 3}})]
    ranked = score_fleet(shipped, members, 3)
    assert [(s.key, s.score) for s in ranked] == [("two", 2.0), ("one", 1.0)]  # mean 1


@pytest.mark.parametrize("code, counts", [(48, True), (79, True), (64, True), (95, True),
                                          (13, False), (31, False), (43, False), (45, False),
                                          (94, False), (None, True)])
def test_an_xid_counts_where_the_catalogue_asks_for_a_reset_a_reboot_or_service(code, counts):
    assert counted("xid", code) is counts
    assert counted("ecc_dbe", None) and counted("software", None)  # other kinds: always


def test_a_node_with_reset_class_xids_scores_above_a_quiet_one_and_application_xids_do_not():
    t = 100 * DAY
    events = [Event(t - 2 * DAY, "reset", "xid", "0", 48), Event(t - DAY, "reset", "xid", "0", 79),
              Event(t - 2 * DAY, "app", "xid", "1", 13), Event(t - DAY, "app", "xid", "1", 31),
              Event(t - DAY, "app", "xid", "1", 94), Event(t - 50 * DAY, "quiet", "xid", "0", 48)]
    ranking = rank(sorted(events, key=lambda e: e.time), t, 10)
    scores = {s.key: s.score for s in ranking.nodes}
    assert scores == {"reset": 10.0}  # 2 XIDs in a fleet of 10 with 2 in all: 10x the mean
    assert ranking.nodes[0].reasons == ("xid (0 in 1d, 2 in 7d, 2 in 28d): 100% of the score",)
    assert [g for g, _ in ranking.gpus["reset"]] == ["0"]


# -- the command -------------------------------------------------------------------------

def _write(path, events):
    path.write_text("".join(e.to_json() + "\n" for e in events))
    return str(path)


T = 1_000 * DAY


def _fleet(tmp_path):
    events = [Event(T - 0.5 * DAY, "bad", "ecc_dbe", gpu="3"),
              Event(T - 2 * DAY, "bad", "ecc_dbe", gpu="3"),
              Event(T - 4 * DAY, "bad", "ib_link_down"),  # a kind the score weighs 0
              Event(T - 20 * DAY, "meh", "xid", gpu="1", xid=79),
              Event(T - 10 * DAY, "app", "xid", gpu="1", xid=13),  # the application's XID
              Event(T - 11 * DAY, "soft", "software"),  # a kind the score weighs 0
              Event(T - 60 * DAY, "gone", "ecc_dbe"),  # older than every window
              Event(T + DAY, "later", "gpu_lost", gpu="0")]  # after T: not seen
    return _write(tmp_path / "events.jsonl", sorted(events, key=lambda e: e.time))


def test_lemons_ranks_nodes_with_gpus_beside_them_from_the_events_before_t(tmp_path, capsys):
    path = _fleet(tmp_path)
    assert main(["lemons", path, "--at", str(T), "--at", str(T + 2 * DAY), "--fleet-nodes", "50",
                 "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    first, second = out["rankings"]
    assert first["at"] == T and second["at"] == T + 2 * DAY
    # zero scores left out: "gone" (no episode in 28 days), "app" (an application XID),
    # "soft" (a kind weighed 0)
    assert [n["node"] for n in first["nodes"]] == ["bad", "meh"]
    bad = first["nodes"][0]
    assert bad["score"] == pytest.approx(100 / 3, rel=1e-5) and first["nodes"][1]["score"] == (
        pytest.approx(50 / 3, rel=1e-5))  # 2 and 1 GPU episodes of 3 in a fleet of 50
    assert [g["gpu"] for g in bad["gpus"]] == ["3"] and bad["gpus"][0]["score"] > 1
    assert bad["reasons"] == ["ecc_dbe (1 in 1d, 2 in 7d, 2 in 28d): 100% of the score"]
    assert "later" in [n["node"] for n in second["nodes"]]


def test_lemons_prints_text_by_default(tmp_path, capsys):
    assert main(["lemons", _fleet(tmp_path), "--at", str(T)]) == 0
    text = capsys.readouterr().out
    assert "2 node(s) above 0" in text and "GPU 3:" in text


def test_lemons_ranks_at_now_without_at(tmp_path, capsys):
    now = time.time()
    path = _write(tmp_path / "e.jsonl", [Event(now - DAY, "n", "ecc_dbe"),
                                         Event(now - 40 * DAY + 1, "m", "ecc_dbe")])
    assert main(["lemons", path, "--format", "json"]) == 0
    (ranking,) = json.loads(capsys.readouterr().out)["rankings"]
    assert int(now) <= ranking["at"] <= time.time() and ranking["at"] == int(ranking["at"])
    assert [n["node"] for n in ranking["nodes"]] == ["n"]  # m's episode: past 28 days


@pytest.mark.parametrize("text, says", [
    (json.dumps([{"time": 1, "node": "a", "kind": "xid"}], indent=1),
     "a JSON list of events, not JSON Lines"),
    (json.dumps({"time": 1, "node": "a", "kind": "xid"}, indent=1), "events.jsonl:1: not JSON"),
    (json.dumps({"events": [{"time": 1, "node": "a", "kind": "xid"}]}), "'time' must be"),
    ("[1, 2", "events.jsonl:2: not JSON"),
])
def test_a_json_document_that_is_not_json_lines_gets_a_hint(tmp_path, capsys, text, says):
    path = tmp_path / "events.jsonl"
    path.write_text(text + "\n")
    assert main(["lemons", str(path), "--at", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    if "'time'" not in says:  # an object a line: JSON Lines, only not an event
        assert "JSON Lines, one event object a line" in err[0]


def test_jsonl_named_reads_a_trace_as_lines_and_refuses_it(tmp_path, capsys):
    trace = _trace(tmp_path, [_record(1.0, "GPU", "GPU Lost")])
    assert main(["lemons", trace, "--input-format", "jsonl", "--at", "10"]) == 2
    assert "fault_trace.json:1: not JSON" in capsys.readouterr().err


def test_the_rankings_do_not_depend_on_how_nodes_are_interleaved(tmp_path):
    events = [Event(T - d * DAY, f"n{d % 3}", "ecc_dbe", gpu=str(d % 2))
              for d in range(10, 0, -1)]
    by_time = rank(events, T, 10)
    by_node = rank(sorted(events, key=lambda e: e.node), T, 10)
    assert by_time.nodes == by_node.nodes and len(by_time.nodes) == 3
    assert by_time.gpus == by_node.gpus


@pytest.mark.parametrize("lines, says", [
    (['{"time": 1, "node": "a", "kind": "xid"}', "{oops"], "events.jsonl:2: not JSON"),
    (['{"time": 1, "node": "a", "kind": "meltdown"}'], "events.jsonl:1: unknown kind 'meltdown'"),
    ([], "events.jsonl: no events"),
    (["", "  "], "events.jsonl: no events"),
])
def test_bad_input_is_one_line_with_file_and_line_and_exit_2(tmp_path, capsys, lines, says):
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + ("\n" if lines else ""))
    assert main(["lemons", str(path), "--at", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert err[0].startswith("cluster-telemetry-exporter: lemons: ")


def test_a_missing_file_and_bad_flags_are_one_line(tmp_path, capsys):
    assert main(["lemons", str(tmp_path / "none.jsonl"), "--at", "10"]) == 2
    assert "none.jsonl: cannot read" in capsys.readouterr().err
    path = _fleet(tmp_path)
    assert main(["lemons", path, "--at", str(T), "--fleet-nodes", "2"]) == 2
    assert "--fleet-nodes 2: the events name 6 nodes" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["lemons", path, "--at", "yesterday"])
    assert stop.value.code == 2
    assert "neither unix seconds nor an ISO 8601" in capsys.readouterr().err


def test_an_iso_time_is_the_same_as_its_unix_seconds(tmp_path, capsys):
    path = _fleet(tmp_path)
    assert main(["lemons", path, "--at", "1972-09-27T00:00:00Z", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["rankings"][0]["at"] == T


# -- the rules ---------------------------------------------------------------------------

def test_the_rules_are_what_the_score_writes():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "build_lemon_rules.py"),
                             "--check"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_iso_time_without_a_zone_is_utc(tmp_path, capsys):
    assert main(["lemons", _fleet(tmp_path), "--at", "1972-09-27T00:00:00"]) == 0
    assert capsys.readouterr().out.startswith("at 86400000 (1972-09-27T00:00:00+00:00)")


def test_lemons_says_which_events_it_did_not_count_and_why(tmp_path, capsys):
    path = _fleet(tmp_path)
    assert main(["lemons", path, "--at", str(T)]) == 0
    err = capsys.readouterr().err.splitlines()
    (line,) = err  # one summary
    assert line.startswith(f"cluster-telemetry-exporter: lemons: {path}: 5 of 8 events not "
                           "counted: "), line
    # by reason, each event under one: its kind, its XID, then its time
    assert "2 of kinds the score weighs 0 (ib_link_down 1, software 1)" in line
    assert "1 XID the catalogue does not send to the hardware (XID 13: 1)" in line
    assert f"at {T:.0f}: 1 at or after it, 1 older than 28 days" in line
    # every event counted: nothing said
    counted_only = _write(tmp_path / "ok.jsonl", [Event(T - DAY, "n", "ecc_dbe")])
    assert main(["lemons", counted_only, "--at", str(T)]) == 0
    assert capsys.readouterr().err == ""


def test_lemons_says_what_the_score_means(tmp_path, capsys):
    assert main(["lemons", _fleet(tmp_path), "--at", str(T)]) == 0
    assert "3.0 = three times the fleet's mean" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["lemons", "--help"])
    assert "3.0 = three times the fleet's mean" in " ".join(capsys.readouterr().out.split())


def test_events_out_of_time_order_are_sorted_and_counted(tmp_path, capsys):
    events = [Event(T - 3 * DAY, "a", "ecc_dbe"), Event(T - 1 * DAY, "b", "ecc_dbe"),
              Event(T - 5 * DAY, "a", "ecc_dbe"), Event(T - 2 * DAY, "a", "gpu_lost"),
              Event(T - 9 * DAY, "b", "ecc_dbe")]
    shuffled = _write(tmp_path / "shuffled.jsonl", events)
    ordered = _write(tmp_path / "ordered.jsonl", sorted(events, key=lambda e: e.time))
    assert main(["lemons", shuffled, "--at", str(T), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    # a's third line came before its previous one, and b's second: two reordered
    assert err.strip() == (f"cluster-telemetry-exporter: lemons: {shuffled}: 2 events came "
                           "before their node's previous one: sorted by time")
    assert main(["lemons", ordered, "--at", str(T), "--format", "json"]) == 0
    again, err = capsys.readouterr()
    assert out == again and err == ""
