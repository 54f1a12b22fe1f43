"""`lemons` input: read as a stream with a line-length cap, absurd times refused in one
line with exit status 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from exporter.cli import main
from tests.tools import REPO

DAY = 86_400.0
T = 1_000 * DAY


def _fleet(tmp_path) -> str:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(
        f'{{"time": {T - (i + 1) * 3600.0}, "node": "node-{i % 3}", "gpu": "GPU-{i % 5}", '
        f'"kind": "xid", "xid": 13}}\n' for i in reversed(range(30))))
    return str(path)


@pytest.mark.parametrize("at", ["1e308", "12345678901234567890123", "-1", "inf",
                                "9999-12-31T23:59:59-05:00"])
def test_an_absurd_time_is_one_line_and_exit_2(tmp_path, at):
    out = subprocess.run([sys.executable, "-m", "exporter", "lemons", _fleet(tmp_path),
                          f"--at={at}"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 2, out.stderr
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "is not a time from 1970 to 9999" in err[0], err


def _limited_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # 1 GiB: far past bounded


def test_an_endless_line_is_refused_in_bounded_memory(tmp_path):
    out = subprocess.run([sys.executable, "-m", "exporter", "lemons", "/dev/zero", "--at", "10"],
                         capture_output=True, text=True, cwd=REPO, timeout=60,
                         preexec_fn=_limited_memory)
    assert out.returncode == 2, out.stderr[-2000:]
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "/dev/zero:1: line longer than 16,384 bytes" in err[0], err


@pytest.mark.parametrize("raw, says", [
    (b'{"time": 1, "node": "a", "kind": "xid"}\n{"time": 2, "node": "' + b"a" * 20_000
     + b'", "kind": "xid"}\n', "events.jsonl:2: line longer than 16,384 bytes"),
    (b'{"time": 1, "node": "a", "kind": "xid"}\n{"time": 2, "node": "\xff", "kind": "xid"}\n',
     "events.jsonl:2: not UTF-8"),
])
def test_a_long_or_undecodable_line_is_named_with_its_number(tmp_path, capsys, raw, says):
    path = tmp_path / "events.jsonl"
    path.write_bytes(raw)
    assert main(["lemons", str(path), "--at", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_the_file_is_read_as_a_stream(tmp_path, monkeypatch):
    """Never the whole text at once: each read asks for at most a line's cap."""
    import io

    from exporter.commands import lemons

    asked = []
    real_open = open

    class Recording(io.BufferedReader):
        def readline(self, size=-1):
            asked.append(size)
            return super().readline(size)

        def read(self, size=-1):
            asked.append(size)
            return super().read(size)

    def recording_open(path, mode="r", *args, **kw):
        return Recording(io.FileIO(path)) if mode == "rb" else real_open(path, mode, *args, **kw)

    monkeypatch.setattr(lemons, "open", recording_open, raising=False)
    events = lemons.read_events(_fleet(tmp_path))
    assert events and asked and all(0 < size <= lemons.MAX_LINE_BYTES + 1 for size in asked)


def test_a_trace_document_past_its_bound_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """A file that opens with `[` is one JSON document, read whole: bounded too."""
    from exporter.commands import lemons

    monkeypatch.setattr(lemons, "MAX_TRACE_BYTES", 1 << 20)
    path = tmp_path / "huge.json"
    path.write_text("[" + ", ".join(["{}"] * 400_000) + "]")
    assert main(["lemons", str(path), f"--at={T}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a JSON document over 1 MiB" in err[0], err
