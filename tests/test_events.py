"""The fault-event vocabulary: one JSON line per event, refused lines say why."""

from __future__ import annotations

import pytest

from exporter.events import KINDS, Event, EventError, parse_event, parse_lines


def test_an_event_round_trips_through_its_line():
    for event in (Event(1.5, "n1", "xid", gpu="GPU-abc", xid=79),
                  Event(1700000000.0, "n2", "ib_link_down")):
        assert parse_event(event.to_json()) == event


def test_the_line_keeps_the_documented_keys_and_leaves_absent_ones_out():
    assert Event(2.0, "n", "ecc_dbe", gpu="0").to_json() == \
        '{"time": 2.0, "node": "n", "gpu": "0", "kind": "ecc_dbe"}'


@pytest.mark.parametrize("line, says", [
    ("{", "not JSON"),
    ("[1]", "not a JSON object"),
    ('{"node": "n", "kind": "xid"}', "'time'"),
    ('{"time": true, "node": "n", "kind": "xid"}', "'time'"),
    ('{"time": NaN, "node": "n", "kind": "xid"}', "'time'"),
    ('{"time": 1, "node": "", "kind": "xid"}', "'node'"),
    ('{"time": 1, "node": "n", "kind": "meltdown"}', "unknown kind 'meltdown'"),
    ('{"time": 1, "node": "n", "kind": "xid", "xid": -3}', "'xid'"),
    ('{"time": 1, "node": "n", "kind": "xid", "gpu": [0]}', "'gpu'"),
])
def test_a_bad_line_is_refused_with_its_reason(line, says):
    with pytest.raises(EventError, match=says):
        parse_event(line)


def test_lines_are_numbered_from_one_and_blank_ones_skipped():
    lines = ['{"time": 1, "node": "a", "kind": "unknown"}', "", "oops"]
    got = list(parse_lines(lines))
    assert [n for n, _ in got] == [1, 3]
    assert isinstance(got[0][1], Event) and isinstance(got[1][1], EventError)


def test_every_kind_is_a_snake_case_word_that_says_what_it_means():
    assert all(kind.isidentifier() and kind.islower() and len(text) > 10
               for kind, text in KINDS.items())
