"""The one shape of every one-line error the command line prints.

`cluster-telemetry-exporter: SUBCOMMAND: MESSAGE` on stderr, whatever went wrong (a
bad flag, config file, trace or device), so scripts and people read one format.
"""

from __future__ import annotations

import sys

PROG = "cluster-telemetry-exporter"
EXIT_USAGE = 2  # bad flags, config or input: systemd does not restart on it
EXIT_FAILURE = 1  # could not run (no driver, port taken)


def error_line(command: str | None, message: str) -> str:
    """The line for `message` from `command` (None: before any subcommand)."""
    return f"{PROG}: {command}: {message}" if command else f"{PROG}: {message}"


def fail(command: str | None, message: str, code: int = EXIT_USAGE) -> int:
    """Print the error line and return the exit code to end with."""
    print(error_line(command, message), file=sys.stderr, flush=True)
    return code
