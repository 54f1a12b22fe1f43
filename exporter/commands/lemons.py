"""`cluster-telemetry-exporter lemons FILE [--at T ...] [--format json]`.

Ranks the nodes (and the GPUs the events name) by the lemon score
(exporter.analysis.lemons) at each time T (default: now), from the events before T only.
It reads the JSON Lines that `history --format jsonl` prints, one node's or many nodes'
concatenated, or InfiniteHBD-Trace's fault_trace.json; the format is sniffed (a file that
starts with `[` is one JSON document: the trace) or named with `--input-format`.
Input it refuses, in one line naming file:line, with exit status 2: a line that is not an
event (not JSON, a missing field, an unknown kind), a line longer than MAX_LINE_BYTES or
not UTF-8, a file with no events, a trace record that is not a fault record, and a JSON
document that is neither (with a hint: JSON Lines is one event a line). Events out of time
order (a node's event before its previous one: files merged by node, or by hand) are
sorted, and it says how many on stderr, as it says which events the score did not count
and why (one line, counts by reason). JSON Lines are read as a stream, a line at a time, so
what it holds in memory is its events, never its text (`/dev/zero` is one line too
long). A time (`--at`) outside 1970 to 9999 is refused in one line too.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import BinaryIO

from exporter.analysis.lemons import (
    DAY,
    NAME,
    WINDOWS,
    Member,
    Model,
    Scored,
    counted,
    score_fleet,
    window_counts,
)
from exporter.errors import error_line, fail
from exporter.events import Event, EventError, parse_lines
from exporter.jsontext import loads
from exporter.offline.infinitehbd import (
    Fault,
    TraceFormatError,
    fallback_notes,
    faults_of,
    to_events,
)
from exporter.options import inputs_of

COMMAND = "lemons"
GPUS_PER_NODE = 8
MAX_LINE_BYTES = 16_384  # an event is about 150 bytes; a longer line is no event
LATEST_TIME = 253_402_300_799.0  # 9999-12-31T23:59:59Z, the last second datetime can write
# what a score's number means, said in the text output and the help
SCALE = (f"{NAME} over the fleet's mean, quiet members counted at 0 (1.0 = the fleet's "
         "mean, 3.0 = three times the fleet's mean, 0 = none in the windows)")


class InputError(ValueError):
    """Input lemons refuses: the message starts with file:line where there is one."""


def read_events(path: str, notes: list[str] | None = None) -> list[Event]:
    """Every event of the file in time order (stable), or InputError for the first line it
    refuses. Events out of order are sorted; `notes` gets a line saying how many."""
    events: list[Event] = []
    latest: dict[str, float] = {}
    reordered = 0
    try:
        with open(path, "rb") as f:
            for number, got in parse_lines(_lines(f, path)):
                if isinstance(got, EventError):
                    raise InputError(f"{path}:{number}: {got}")
                before = latest.get(got.node)
                if before is not None and got.time < before:
                    reordered += 1  # a file merged by node, or by hand: sorted below
                else:
                    latest[got.node] = got.time
                events.append(got)
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror or err}") from None
    if not events:
        raise InputError(f"{path}: no events (an empty file ranks nothing)")
    if reordered:
        events.sort(key=lambda e: e.time)
        if notes is not None:
            notes.append(f"{path}: {reordered} event{'s' if reordered > 1 else ''} came before "
                         "their node's previous one: sorted by time")
    return events


JSONL, INFINITEHBD = "jsonl", "infinitehbd"
# A trace is one JSON document, read whole: a bound on it, far above any real trace's size
MAX_TRACE_BYTES = 256 << 20
INPUT_FORMATS = ("auto", JSONL, INFINITEHBD)
NOT_JSON_LINES = ("lemons reads JSON Lines, one event object a line (history --format jsonl), "
                  "or InfiniteHBD-Trace's fault_trace.json; a JSON document spread over "
                  "lines is neither (jq -c '.[]' FILE writes a list's items one a line)")


def sniff(path: str) -> str:
    """The file's format from its first non-blank character: `[` opens one JSON document
    (InfiniteHBD-Trace's list of records); anything else is taken for JSON Lines."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return JSONL  # read_events names what is wrong
    return INFINITEHBD if head.lstrip()[:1] == b"[" else JSONL


def read_trace(path: str) -> list[Fault]:
    """InfiniteHBD-Trace's records, or InputError (a hint where they are events)."""
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_TRACE_BYTES + 1)
        if len(text) > MAX_TRACE_BYTES:
            raise InputError(f"{path}: a JSON document over {MAX_TRACE_BYTES >> 20} MiB "
                             "(InfiniteHBD-Trace's is under 1 MiB); JSON Lines are read as "
                             "a stream")
        records = loads(text.decode("utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read: {getattr(err, 'strerror', None) or err}") \
            from None
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{err.lineno}: not JSON ({err.msg} at column {err.colno})"
                         f"; {NOT_JSON_LINES}") from None
    if isinstance(records, list) and records and isinstance(records[0], dict) \
            and "kind" in records[0]:
        raise InputError(f"{path}: a JSON list of events, not JSON Lines; {NOT_JSON_LINES}")
    try:
        return faults_of(records)
    except TraceFormatError as err:
        raise InputError(f"{path}: {err} (InfiniteHBD-Trace's fault_trace.json?); "
                         f"{NOT_JSON_LINES}") from None


def load_input(path: str, input_format: str = "auto",
               notes: list[str] | None = None) -> tuple[str, list]:
    """(format, its records): InfiniteHBD-Trace's faults, or the events of JSON Lines
    (`notes`: what the reading had to say, such as events it sorted)."""
    fmt = sniff(path) if input_format == "auto" else input_format
    if fmt == INFINITEHBD:
        return fmt, read_trace(path)
    try:
        return fmt, read_events(path, notes)
    except InputError as err:
        if f"{path}:1: not JSON" in str(err):  # a JSON document spread over lines?
            raise InputError(f"{err}; {NOT_JSON_LINES}") from None
        raise


def _lines(f: BinaryIO, path: str) -> Iterator[str]:
    """The file's lines, each read with a cap: InputError for one too long or not UTF-8."""
    for number in itertools.count(1):
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES:
            raise InputError(f"{path}:{number}: line longer than {MAX_LINE_BYTES:,} bytes "
                             "(an event is one short JSON object)")
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{path}:{number}: not UTF-8") from None


def members_at(events: Sequence[Event], at: float, key) -> list[Member]:
    """The members (key(event): a node, or a node's GPU; None: not one) with episodes in
    the windows at `at`."""
    ages: dict[str, dict[str, list[float]]] = {}
    for e in events:
        k = key(e)
        if e.time < at and k is not None and counted(e.kind, e.xid):
            ages.setdefault(k, {}).setdefault(e.kind, []).append((at - e.time) / DAY)
    out = []
    for k, kinds in ages.items():
        counts = {kind: c for kind, a in kinds.items() if (c := window_counts(a))}
        if counts:
            out.append(Member(k, counts))
    return out


@dataclass(frozen=True, slots=True)
class Ranking:
    at: float
    nodes: list[Scored]
    gpus: dict[str, list[tuple[str, Scored]]]  # node -> (gpu, its score), by score


def rank(events: Sequence[Event], at: float, fleet_nodes: int,
         gpus_per_node: int = GPUS_PER_NODE, model: Model | None = None) -> Ranking:
    """Nodes (fleet_nodes in all, quiet ones included) and GPUs (gpus_per_node of each
    node) by descending score at `at`, from the events before it."""
    model = model or Model()
    nodes = score_fleet(model, members_at(events, at, lambda e: e.node), fleet_nodes)
    gpu_members = members_at(events, at,
                             lambda e: None if e.gpu is None else f"{e.node}\0{e.gpu}")
    gpus: dict[str, list[tuple[str, Scored]]] = {}
    for s in score_fleet(model, gpu_members, fleet_nodes * gpus_per_node):
        node, gpu = s.key.split("\0", 1)
        gpus.setdefault(node, []).append((gpu, s))
    return Ranking(at, nodes, gpus)


def uncounted(events: Sequence[Event], times: Sequence[float],
              model: Model | None = None) -> str:
    """Which events no score counted and why, in one phrase ("" when every one counted):
    each event under its first reason, its kind weighed 0, its XID not one for the
    hardware, then, at each ranking time, after it or older than the longest window."""
    model = model or Model()
    kinds: Counter[str] = Counter()
    xids: Counter[int | None] = Counter()
    timed = []
    for e in events:
        if model.weight(e.kind) <= 0:
            kinds[e.kind] += 1
        elif not counted(e.kind, e.xid):
            xids[e.xid] += 1
        else:
            timed.append(e.time)
    longest = WINDOWS[-1][1]
    parts = []
    if kinds:
        listed = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
        parts.append(f"{kinds.total()} of kinds the score weighs 0 ({listed})")
    if xids:
        listed = ", ".join(f"XID {x}: {n}" for x, n in sorted(xids.items()))
        parts.append(f"{xids.total()} XID{'s' if xids.total() > 1 else ''} the catalogue "
                     f"does not send to the hardware ({listed})")
    left_out = 0
    for at in times:
        after = sum(1 for t in timed if t >= at)
        older = sum(1 for t in timed if t < at and (at - t) / DAY >= longest)
        if after or older:
            parts.append(f"at {at:.0f}: {after} at or after it, {older} older than "
                         f"{longest:g} days")
        left_out = max(left_out, after + older)
    total = kinds.total() + xids.total() + left_out
    if not parts:
        return ""
    return f"{total} of {len(events)} events not counted: " + "; ".join(parts)


def _number(x: float) -> float:
    return float(f"{x:.6g}")


def to_json(rankings: Sequence[Ranking]) -> dict:
    out = []
    for r in rankings:
        nodes = []
        for s in r.nodes:
            entry: dict = {"node": s.key, "score": _number(s.score), "reasons": list(s.reasons)}
            if r.gpus.get(s.key):
                entry["gpus"] = [{"gpu": gpu, "score": _number(g.score),
                                  "reasons": list(g.reasons)} for gpu, g in r.gpus[s.key]]
            nodes.append(entry)
        out.append({"at": r.at, "nodes": nodes})
    return {"rankings": out}


def to_text(rankings: Sequence[Ranking]) -> str:
    lines = []
    for r in rankings:
        lines.append(f"at {r.at:.0f} ({datetime.fromtimestamp(r.at, UTC).isoformat()}): "
                     f"{len(r.nodes)} node(s) above 0")
        for s in r.nodes:
            lines.append(f"  {s.score:8.2f}  {s.key}: " + "; ".join(s.reasons))
            for gpu, g in r.gpus.get(s.key, []):
                lines.append(f"  {g.score:8.2f}    GPU {gpu}: " + "; ".join(g.reasons))
    lines.append(f"score: {SCALE}")
    return "\n".join(lines) + "\n"


def parse_time(text: str) -> float:
    """Unix seconds, or an ISO 8601 date-time (UTC unless it says otherwise)."""
    try:
        value = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is neither unix seconds nor an ISO 8601 date-time") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        value = parsed.timestamp()
    if not math.isfinite(value) or not 0.0 <= value <= LATEST_TIME:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a time from 1970 to 9999 (unix seconds 0 to "
            f"{LATEST_TIME:.0f})")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not at least 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (f"Rank nodes and GPUs by the lemon score: {SCALE}. Events it does "
                          "not count, and why, are summed up in one line on stderr.")
    parser.add_argument("events", metavar="FILE",
                        help="fault events, one JSON object a line (history --format jsonl), "
                        "or InfiniteHBD-Trace's fault_trace.json")
    parser.add_argument("--input-format", choices=INPUT_FORMATS, default="auto",
                        help="the file's format (default: sniffed; a file starting with '[' "
                        "is InfiniteHBD-Trace's)")
    parser.add_argument("--at", action="append", type=parse_time, metavar="T",
                        help="rank at this time (unix seconds or ISO 8601) from the events "
                        "before it (default: now); repeat for more rankings")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--fleet-nodes", type=_positive, metavar="N",
                        help="nodes in the fleet, quiet ones included (default: the nodes "
                        "the events name)")
    parser.add_argument("--gpus-per-node", type=_positive, default=GPUS_PER_NODE, metavar="G",
                        help=f"GPUs per node, for the GPUs' fleet (default {GPUS_PER_NODE})")


@dataclass(frozen=True)
class LemonsRequest:
    """The lemons command's inputs."""

    events: str  # the events file
    at: list[float] | None = None  # the times to rank at; None: now
    format: str = "text"
    input_format: str = "auto"
    fleet_nodes: int | None = None  # None: the nodes the events name
    gpus_per_node: int = GPUS_PER_NODE


def main(args: argparse.Namespace) -> int:
    req = inputs_of(LemonsRequest, args)
    notes: list[str] = []
    try:
        fmt, loaded = load_input(req.events, req.input_format, notes)
    except InputError as err:
        return fail(COMMAND, str(err))
    for note in notes:
        print(error_line(COMMAND, note), file=sys.stderr)
    if fmt == INFINITEHBD:
        for note in fallback_notes(loaded):
            print(error_line(COMMAND, f"{req.events}: {note}"), file=sys.stderr)
        events = to_events(loaded)
        if not events:
            return fail(COMMAND, f"{req.events}: no fault starts (a trace without one ranks "
                        "nothing)")
    else:
        events = loaded
    named = len({e.node for e in events})
    fleet = req.fleet_nodes if req.fleet_nodes is not None else named
    if fleet < named:
        return fail(COMMAND, f"--fleet-nodes {fleet}: the events name {named} nodes")
    times = req.at or [float(int(time.time()))]  # default: now, to the second
    rankings = [rank(events, at, fleet, req.gpus_per_node) for at in times]
    summary = uncounted(events, times)
    if summary:
        print(error_line(COMMAND, f"{req.events}: {summary}"), file=sys.stderr)
    if req.format == "json":
        json.dump(to_json(rankings), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(to_text(rankings))
    return 0
