"""JSON from outside nested thousands deep (`[` x 5,000) is bad input like any other: one
clear line and the command's exit for it, never a RecursionError's traceback. Each
command that reads JSON it did not write: `lemons` (JSON Lines and InfiniteHBD-Trace's
document), `health` (the exporter's answer), `analyze` (a cte trace's header)."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer

import pytest

from exporter.cli import main
from exporter.events import EventError, parse_event
from tests.test_health_command import _Canned

DEEP = "[" * 5000


def one_line(capsys) -> tuple[str, str]:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "RecursionError" not in out + err
    return out, err


def test_deep_json_is_a_decode_error_with_where_it_went_too_deep():
    from exporter.jsontext import loads

    with pytest.raises(json.JSONDecodeError) as caught:
        loads('{"a": ' + DEEP)
    assert "nested" in caught.value.msg and caught.value.lineno == 1
    assert 6 < caught.value.colno < 5006  # inside the brackets, past the first
    with pytest.raises(json.JSONDecodeError):
        loads(("{" + '"k": ') * 5000)
    # brackets inside strings are text, not depth
    assert loads(json.dumps({"k": DEEP})) == {"k": DEEP}
    assert loads(b"[[1]]") == [[1]]


def test_a_deep_event_line_is_refused_with_its_line(tmp_path, capsys):
    with pytest.raises(EventError, match="not JSON .*nested"):
        parse_event(DEEP)
    events = tmp_path / "events.jsonl"
    events.write_text('{"time": 1, "node": "a", "kind": "xid", "xid": 79}\n' + DEEP + "\n")
    assert main(["lemons", str(events)]) == 2
    _, err = one_line(capsys)
    assert err.count("\n") == 1 and f"{events}:2: not JSON" in err and "nested" in err


def test_a_deep_trace_document_is_refused_in_one_line(tmp_path, capsys):
    trace = tmp_path / "fault_trace.json"
    trace.write_text(DEEP)  # starts with '[': read as InfiniteHBD-Trace's document
    assert main(["lemons", str(trace)]) == 2
    _, err = one_line(capsys)
    assert err.count("\n") == 1 and f"{trace}:1: not JSON" in err and "nested" in err


def test_a_deep_answer_is_unknown_to_health(capsys):
    handler = type("Handler", (_Canned,), {"status": 200, "body": DEEP.encode()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code = main(["health", f"--web.listen-address=127.0.0.1:{server.server_address[1]}"])
    finally:
        server.shutdown()
        server.server_close()
    out, _ = one_line(capsys)
    assert code == 2 and out.count("\n") == 1
    assert out.startswith("unknown: ") and "answered no verdict: not JSON" in out
    assert "nested" in out


def test_a_deep_cte_header_is_refused_in_one_line(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text(f"# cte-trace v1 {DEEP}\nt,gpu,power_watts\n0,0,100\n")
    assert main(["analyze", str(trace)]) == 2
    _, err = one_line(capsys)
    assert err.count("\n") == 1 and "cte header" in err and "nested" in err
