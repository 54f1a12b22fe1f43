"""The exporter's program with the fake NVML's own accounts on SIGUSR1, in the format a
side-by-side harness reads from a peer run on its fake (`--stats-file`): so the CPU the
fake spends standing in for the driver can be taken off ours as it is off the peer's.

    python bench/ours_on_fake.py --stats-file PATH -- run --fake --no-fake.costs \\
        --web.listen-address 127.0.0.1:9955

Everything after `--` goes to `cluster-telemetry-exporter`, run in this process as the
installed program runs (exporter/entry.py). On SIGUSR1 it writes one JSON
object to PATH (through a temporary file, replaced whole): `time` (wall clock),
`process_cpu_s` (the process's user + system time), `fake_calls` and `fake_cpu_s` (the
calls into the fake and the thread CPU spent inside them, every thread: the fake's own
Python, which a real driver does not run, or with call costs on what the model charged
where that is more), `missing_symbols` (symbols asked for that the fake lacks). Until
the exporter has installed its fake, the fake's figures are 0. Not a pass/fail test.

`--no-analyses` starts the sampler without its live analyses (power swings, stalls,
stragglers, goodput), as `record` starts it: what sampling, publishing and serving cost
alone, to hold a CPU figure against. A measurement, not a mode of the exporter.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

_seen: list[Any] = []  # the fake once found (NVML's shutdown takes it from pynvml)


def accounts() -> dict[str, Any]:
    """The fake's figures now (zeros before the exporter has put it under pynvml)."""
    import pynvml

    from exporter.sim.fake import FakeNvmlLibrary

    if not _seen and isinstance(pynvml.nvmlLib, FakeNvmlLibrary):
        _seen.append(pynvml.nvmlLib)
    fake = _seen[0] if _seen else None
    return {
        "time": time.time(),
        "process_cpu_s": sum(os.times()[:2]),
        "fake_calls": sum(list(fake.calls.values())) if fake else 0,
        "fake_cpu_s": fake.busy_seconds if fake else 0.0,
        "missing_symbols": sorted(fake.missing) if fake else [],
    }


def write(path: str) -> None:
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w") as f:
        json.dump(accounts(), f)
    os.replace(temporary, path)


def without_analyses() -> None:
    """The sampler settings the exporter starts with, less the live analyses."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as exporter/entry.py, before numpy
    import dataclasses

    import exporter.app as app

    made = app.sampler_settings

    def less(*args: Any, **kwargs: Any) -> Any:
        return dataclasses.replace(made(*args, **kwargs), power=None, stragglers=None)

    app.sampler_settings = less


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stats-file", required=True, help="where SIGUSR1 writes the accounts")
    parser.add_argument("--no-analyses", action="store_true",
                        help="start the sampler without its live analyses (a measurement)")
    argv = sys.argv[1:]
    if "--" not in argv:
        parser.error("give the exporter's arguments after --")
    args = parser.parse_args(argv[:argv.index("--")])
    if args.no_analyses:
        without_analyses()
    # the exporter's own signal handling leaves SIGUSR1 alone; its main thread wakes on
    # any handled signal (signal.set_wakeup_fd), so the handler runs at once
    signal.signal(signal.SIGUSR1, lambda *_: write(args.stats_file))
    from exporter.entry import main as program

    return program(argv[argv.index("--") + 1:])


if __name__ == "__main__":
    sys.exit(main())
