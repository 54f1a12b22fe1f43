"""The `cluster-telemetry-exporter` program: `health` at once, every other command
through exporter/cli.py.

node-problem-detector and slurmd run `health` every 30 to 60 s on every GPU node. It only
asks a running exporter, so it needs neither the sampler, the collectors nor numpy, whose
import is most of the full command line's start: this way a run of `health` costs about
a quarter of the CPU.

Every other command does its linear algebra on a few GPUs' rows, in one thread: numpy's
OpenBLAS would otherwise start a worker per CPU (up to 64) at numpy's import, each
spinning about 0.1 s before it sleeps, at every start, on 100-core GPU nodes
(docs/performance.md). A setting of the user's own is kept.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["health"]:
        from exporter.commands.health.command import run

        return run(args[1:])
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # read when numpy loads OpenBLAS
    from exporter.cli import main as full

    return full(args)


if __name__ == "__main__":
    sys.exit(main())
