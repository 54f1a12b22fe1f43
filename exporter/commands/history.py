"""`cluster-telemetry-exporter history`: the episodes stored in a state directory, one
JSON line each (docs/history.md)."""

from __future__ import annotations

import argparse
import sys

from exporter.errors import EXIT_FAILURE, fail
from exporter.options import finite


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage.path", dest="storage_path", required=True, metavar="DIR",
                        help="the state directory (run's --storage.path)")
    parser.add_argument("--format", choices=("jsonl",), default="jsonl",
                        help="output format (default jsonl: the fault-event lines)")
    parser.add_argument("--since", type=finite, metavar="UNIX_SECONDS",
                        help="only episodes that started at or after this time")
    parser.add_argument("--until", type=finite, metavar="UNIX_SECONDS",
                        help="only episodes that started before this time")
    parser.add_argument("--gpu", metavar="UUID|SERIAL",
                        help="only this GPU's episodes (node: the node's own)")


def main(args: argparse.Namespace) -> int:
    import sqlite3  # here: cli.py builds every command's parser, few run this one

    from exporter.history.answer import jsonl_lines
    from exporter.history.store import DamagedStore

    gpu = "" if args.gpu == "node" else args.gpu
    try:
        for line in jsonl_lines(args.storage_path, args.since, args.until, gpu):
            sys.stdout.write(line + "\n")
    except BrokenPipeError:
        return 0
    except DamagedStore as exc:
        return fail("history", str(exc), EXIT_FAILURE)
    except (OSError, sqlite3.Error) as exc:
        return fail("history", f"{args.storage_path}: {exc}", EXIT_FAILURE)
    return 0
