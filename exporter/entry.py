"""The `cluster-telemetry-exporter` program: `health` at once, every other command
through exporter/cli.py.

node-problem-detector and slurmd run `health` every 30 to 60 s on every GPU node. It only
asks a running exporter, so it needs neither the sampler, the collectors nor numpy, whose
import is most of the full command line's start: this way a run of `health` costs about
a quarter of the CPU.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["health"]:
        from exporter.commands.health.command import run

        return run(args[1:])
    from exporter.cli import main as full

    return full(args)


if __name__ == "__main__":
    sys.exit(main())
