"""analyze's input: the trace read with only the fields its analyses use, the read's
progress on a terminal, and the notes on what reading it skipped, dropped or merged."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import TextIO

from exporter.errors import error_line
from exporter.gpu import gpm
from exporter.offline.request import AnalyzeRequest
from exporter.traces.load import load_trace
from exporter.traces.reading import reason_kind
from exporter.traces.trace import Trace

# Rows merged or sorted into place, as a share of the rows, from which analyze also warns
# on stderr: past 5 % the timestamps are too coarse or repeated (a log appended to itself,
# a stamp without milliseconds polled faster than once a second), and the report's
# durations and rates describe far fewer samples than the file holds.
WARN_COLLAPSED_SHARE = 0.05


# canonical trace field -> scan() keyword
STRAGGLER_FIELDS = {
    "sm_clock_hertz": "sm_clock",
    "temperature_celsius": "temperature",
    "utilization_gpu_ratio": "utilization",
    "clock_event_reasons": "clock_event_reasons",
}


# the canonical fields the analyses read; the others are dropped as the trace is read
ANALYZED_FIELDS = frozenset({"power_watts", "power_limit_watts", *STRAGGLER_FIELDS,
                             *gpm.COMPUTE_KEYS})


class ReadProgress:
    """How much of the trace has been read, redrawn in place on ``stream`` (a terminal)
    at most twice a second, once the read has taken ``after`` seconds."""

    def __init__(self, path: str, stream: TextIO, after: float = 1.0) -> None:
        self.path, self.stream, self.after = path, stream, after
        self.start = self.last = time.monotonic()
        self.width = 0

    def __call__(self, done: int, size: int) -> None:
        now = time.monotonic()
        if now - self.start < self.after or (self.width and now - self.last < 0.5):
            return
        self.last = now
        line = (f"{error_line('analyze', f'reading {self.path}')}: {100 * done / size:3.0f} % "
                f"({done / 1e6:,.0f} of {size / 1e6:,.0f} MB)")
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()
        self.width = len(line)

    def clear(self) -> None:
        """Erase the line, if one was drawn."""
        if self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


def load(req: AnalyzeRequest, stream: TextIO | None = None) -> Trace:
    """The trace ``req`` names, with only the fields the analyses read; the read's progress
    on ``stream`` (default: stderr) when it is a terminal, and a warning there when many
    rows were merged or sorted into place."""
    stream = stream or sys.stderr
    progress = ReadProgress(req.file, stream) if stream.isatty() else None
    try:
        trace = load_trace(req.file, gpus=req.gpus, fields=ANALYZED_FIELDS, progress=progress)
    finally:
        if progress is not None:
            progress.clear()
    share = collapsed_share(trace)
    if share >= WARN_COLLAPSED_SHARE:
        print(error_line("analyze", f"warning: {trace.source}: {100 * share:.1f} % of its rows "
                         f"were merged ({trace.collapsed_rows:,} with the time of another row "
                         f"of their GPU) or sorted into place ({trace.out_of_order_rows:,} out "
                         "of order): see collapsed_rows and out_of_order_rows"),
              file=stream, flush=True)
    return trace


def _skip_reasons(reasons: Counter[str], top: int = 4) -> str:
    """The commonest reasons lines were skipped, as written (real counts and values).

    Reasons that differ only in their numbers or quoted cells ("3 cells, column line has
    5" and "4 cells, column line has 5") are one kind, so one kind cannot crowd out the
    others; each kind shows its commonest wording and how many lines read otherwise.
    """
    kinds: dict[str, Counter[str]] = {}
    for why, n in reasons.items():
        kinds.setdefault(reason_kind(why), Counter())[why] += n
    parts = []
    for wordings in sorted(kinds.values(), key=lambda c: -c.total())[:top]:
        why, n = wordings.most_common(1)[0]
        others = wordings.total() - n
        parts.append(f"{why} ({n}; {others} more like it)" if others else f"{why} ({n})")
    return ", ".join(parts)


def input_notes(trace: Trace) -> list[str]:
    notes = []
    if trace.skipped_lines:
        notes.append(f"{trace.skipped_lines} line(s) skipped, first at line "
                     f"{trace.skipped[0][0]}: {_skip_reasons(trace.skip_reasons)}")
    if trace.rejected:
        notes.append(f"{sum(trace.rejected.values())} implausible value(s) dropped: "
                     + ", ".join(f"{why} ({n})" for why, n in sorted(trace.rejected.items())))
    if trace.collapsed_rows or trace.out_of_order_rows:
        notes.append(_collapsed_note(trace))
    return notes


def _collapsed_note(trace: Trace) -> str:
    """What merging rows of one GPU and time, and sorting rows read out of order, did."""
    parts = []
    if trace.collapsed_rows:
        parts.append(f"{trace.collapsed_rows} row(s) had the time of an earlier row of "
                     "their GPU and were merged into it (the later values win): the "
                     "timestamps repeat, so the trace is shorter than its rows")
    if trace.out_of_order_rows:
        parts.append(f"{trace.out_of_order_rows} row(s) came earlier than a row of their "
                     "GPU read before them and were sorted into place")
    return "; ".join(parts)


def collapsed_share(trace: Trace) -> float:
    """The share of the trace's rows merged or sorted into place."""
    kept = sum(s.t.size for s in trace.series.values())
    return (trace.collapsed_rows + trace.out_of_order_rows) / max(1, kept
                                                                  + trace.collapsed_rows)
