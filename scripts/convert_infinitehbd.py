#!/usr/bin/env python3
"""Write InfiniteHBD-Trace's fault_trace.json as our fault events (JSON Lines).

    scripts/convert_infinitehbd.py fault_trace.json > events.jsonl

Node ids are kept; each `fault_start` is one event of the kind DESC_KINDS gives its Class
and Desc (docs/health.md, "Lemon score"); a pair the table lacks takes its Class's kind
(else its Level's), and standard error names each such pair with its count. Days become
unix seconds from day 0 = 2024-01-01 00:00 UTC (the trace has no dates).
`lemons events.jsonl --at T` reads it.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.offline.infinitehbd import (  # noqa: E402
    TraceFormatError,
    load_faults,
    to_events,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="fault_trace.json")
    parser.add_argument("-o", "--output", help="file to write (default: standard output)")
    args = parser.parse_args(argv)
    try:
        faults = load_faults(args.trace)
    except (OSError, ValueError) as err:  # TraceFormatError and JSON errors are ValueErrors
        kind = "" if isinstance(err, TraceFormatError) else f"{args.trace}: "
        print(f"convert_infinitehbd: {kind}{err}", file=sys.stderr)
        return 2
    events = to_events(faults)
    fallbacks = Counter((f.cls, f.desc, f.kind) for f in faults if f.start and not f.in_table)
    for (cls, desc, kind), count in sorted(fallbacks.items()):
        print(f"convert_infinitehbd: Class {cls!r}, Desc {desc!r} is not in the table: "
              f"{count} fault(s) as {kind!r}, its Class's kind", file=sys.stderr)
    text = "".join(e.to_json() + "\n" for e in events)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    print(f"{len(events)} events from {len({e.node for e in events})} nodes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
