"""Command line: run, check-config, analyze, simulate, record, history, lemons, health."""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import logging
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from exporter import __version__
from exporter.collectors import registry
from exporter.config import all_options, build_config, load_config_file
from exporter.errors import EXIT_FAILURE, EXIT_USAGE, PROG, fail
from exporter.gpu.backend import NvmlUnavailable
from exporter.metrics.selection import load_selection
from exporter.options import RUN, add_flags
from exporter.yamlfile import ConfigError


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.split(" ", 1)[1] if " " in self.prog else None
        sys.exit(fail(command, f"{message} (see --help)"))


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML config file (flags win over it)")
    add_flags(parser, RUN, all_options())


# The commands of exporter/commands/, in --help's order: name -> (module, help). Each is
# imported only when it runs or its flags are parsed: `run` then loads none of the offline
# analysis, the fleet or the recorder (docs/performance.md, memory).
_COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("exporter.commands.simulate.command",
                 "run a fleet of simulated nodes in one process, one port each"),
    "record": ("exporter.commands.record",
               "record GPU samples (power at full rate) to a trace file"),
    "analyze": ("exporter.commands.analyze",
                "analyse a trace (ours or an nvidia-smi CSV log) offline"),
    "lemons": ("exporter.commands.lemons",
               "rank nodes and GPUs by how likely they fail again (fault events)"),
    "health": ("exporter.commands.health.command",
               "ask the local exporter for its verdict: one line, exit 0 OK, 1 problem, 2 "
               "unknown (node-problem-detector); --slurm-drain drains via scontrol"),
    "history": ("exporter.commands.history",
                "print the episodes stored in a state directory, one JSON line each "
                "(docs/history.md)"),
}


def _command(name: str) -> ModuleType:
    return importlib.import_module(_COMMANDS[name][0])


def _command_named(argv: Sequence[str]) -> str | None:
    """The subcommand argv names (its first word that is no flag), if any."""
    return next((word for word in argv if not word.startswith("-")), None)


def _scenario_names() -> list[str]:
    """The built-in scenarios' names (sim.scenarios.builtin_names, read here without
    importing the simulator: `run` on real hardware never loads it; nor importlib.resources
    with zipfile, for a folder beside this file)."""
    folder = Path(__file__).parent / "scenarios"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line. With `only`, the other commands of exporter/commands/ are listed
    in --help but their modules are not imported nor their flags declared."""
    parser = _Parser(prog=PROG, description="Per-node Prometheus exporter for GPU training "
                     "clusters: high-rate power, swings, stragglers and failing hardware.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    scenarios = textwrap.fill(  # a name is never broken at its hyphen
        "built-in scenarios for --fake --scenario NAME (docs/scenarios.md): "
        f"{', '.join(_scenario_names())}.", 79, break_on_hyphens=False)
    run = commands.add_parser("run", help="sample GPUs and serve /metrics", epilog=scenarios,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_run_flags(run)
    check = commands.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("file", metavar="FILE")
    for name, (_, help_text) in _COMMANDS.items():
        sub = commands.add_parser(name, help=help_text)
        if only is None or only == name:
            _command(name).add_arguments(sub)
    return parser


def _did_you_mean(parser: argparse.ArgumentParser, command: str | None,
                  extra: list[str]) -> str:
    """" (did you mean --flag?)" for the first unknown flag close to one of the
    subcommand's, as the config file's unknown keys get."""
    commands = next((a for a in parser._actions
                     if isinstance(a, argparse._SubParsersAction)), None)
    sub = commands.choices.get(command) if commands is not None and command else None
    flags = list(sub._option_string_actions) if sub is not None else []
    import difflib  # only for a bad flag

    for word in extra:
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.75)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


# glibc's mallopt() parameters (malloc.h): the most malloc arenas, the size from which an
# allocation is its own mapping
M_ARENA_MAX = -8
MALLOC_ARENAS = 2
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's default, held there


def cap_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """glibc gives each thread that allocates an arena of its own (up to 8 per core), and
    memory freed in one is reused by no other: a dozen threads that each allocate numpy
    temporaries once a second kept ~3 MiB more resident than two shared arenas
    (docs/performance.md, memory). The GIL lets one thread allocate at a time anyway.
    False where the C library has no mallopt (not glibc)."""
    try:
        return bool(ctypes.CDLL(None).mallopt(M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        return False


def fix_mmap_threshold(size: int = MMAP_THRESHOLD_BYTES) -> bool:
    """glibc raises its mmap threshold to the size of each mapped block freed (up to 32
    MiB), so after the first large numpy temporary (a 660 s window, an FFT) later ones
    come from the heap, and the heap keeps their pages: ~2 MB more resident over the
    first minutes of `run --fake` (docs/performance.md, memory). Held at 128 KiB, each
    is mapped and handed back when freed. False where the C library has no mallopt."""
    try:
        return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, size))
    except (OSError, AttributeError):
        return False


def tune_interpreter() -> None:
    """Before start: hand the GIL over every 1 ms instead of 5 ms, so a scrape's thread
    is not held up behind a snapshot being rendered, cap glibc's malloc arenas and hold
    its mmap threshold (docs/performance.md). The benchmarks call it too, to measure what
    `run` runs."""
    sys.setswitchinterval(0.001)
    cap_malloc_arenas()
    fix_mmap_threshold()


def freeze_startup_objects() -> None:
    """After start: what start-up built (modules, catalogue, buffers) lives as long as
    the process; out of the collector's sight, each full collection has a fraction of
    the objects to walk."""
    gc.freeze()


def _run(args: argparse.Namespace) -> int:
    from exporter.app import Exporter  # imported here so --help stays fast
    from exporter.service import Signals, serve

    overrides = {o.key: getattr(args, o.key) for o in all_options()
                 if o.flag is not None and RUN in o.commands}
    config = build_config(args.config, overrides)
    if config.backend.fake:
        from exporter.sim.scenarios import load_scenario  # not needed on real hardware

        # an unknown scenario is a usage error, before anything
        load_scenario(config.backend.scenario)
    logging.basicConfig(level=config.log.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_interpreter()
    signals = Signals()  # before start: a SIGHUP then must not kill us (its default)
    exporter = Exporter(config)
    try:
        exporter.start()
    except NvmlUnavailable as exc:
        return fail("run", f"{exc}. This machine has no usable NVIDIA driver. To try the "
                    f"exporter on a simulated node, run: {PROG} run --fake", EXIT_FAILURE)
    except RuntimeError as exc:  # StoreBusy: its module is loaded only with a state directory
        from exporter.history.store import StoreBusy

        if not isinstance(exc, StoreBusy):
            raise
        return fail("run", str(exc), EXIT_FAILURE)
    except OSError as exc:
        return fail("run", f"cannot listen on {config.serving.listen_address}: "
                    f"{exc.strerror or exc}", EXIT_FAILURE)
    freeze_startup_objects()
    serve(exporter, signals, args.config, overrides)  # until SIGINT/SIGTERM; SIGHUP reloads
    exporter.stop()
    signals.close()
    return 0


def _check_config(path: str) -> int:
    from exporter.web.webconfig import load_web_config

    config = load_config_file(path)
    web = load_web_config(config.serving.web_config_file)
    security = ("TLS" if web.tls else "plain HTTP") + (
        f", basic auth for {len(web.users)} user(s)" if web.auth else "")
    selection = load_selection(config.metrics.profile, config.metrics.file)
    collectors = ", ".join(s.name for s in registry.enabled(config.collectors)
                           if selection.needs_collector(s.name)) or "none"
    s = config.sampler
    print(f"{path}: ok (listen {config.serving.listen_address}, {security}; "
          f"power buffer drained every {s.power_drain_interval_seconds:g} s, "
          f"polled at {s.power_sample_rate_hz:g} Hz where there is none; "
          f"sweep {s.sweep_interval_seconds:g} s; collectors: {collectors}; "
          f"metrics: {selection.describe()})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=_command_named(argv) or "")
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would name the top-level parser, not the subcommand
        return fail(args.command, f"unrecognized arguments: {' '.join(extra)}"
                    f"{_did_you_mean(parser, args.command, extra)} (see --help)")
    try:
        if args.command == "run":
            return _run(args)
        if args.command in _COMMANDS:
            return _command(args.command).main(args)
        if args.command == "check-config":
            return _check_config(args.file)
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:  # ConfigError or TraceError: one line, exit 2
        from exporter.traces.trace import TraceError  # loaded by what read a trace

        if not isinstance(exc, ConfigError | TraceError):
            raise
        return fail(args.command, str(exc))


if __name__ == "__main__":
    sys.exit(main())
