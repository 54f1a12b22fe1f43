"""Command line: run, check-config, analyze, simulate, record, history, lemons, health."""

from __future__ import annotations

import argparse
import difflib
import gc
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from exporter import __version__
from exporter.collectors import registry
from exporter.config import all_options, build_config, load_config_file
from exporter.errors import EXIT_FAILURE, EXIT_USAGE, PROG, fail
from exporter.gpu.backend import NvmlUnavailable
from exporter.history.store import StoreBusy
from exporter.metrics.selection import load_selection
from exporter.options import RUN, SIMULATE, add_flags, resolve
from exporter.sim.scenarios import load_scenario
from exporter.traces.trace import TraceError
from exporter.web.webconfig import load_web_config
from exporter.yamlfile import ConfigError


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.split(" ", 1)[1] if " " in self.prog else None
        sys.exit(fail(command, f"{message} (see --help)"))


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML config file (flags win over it)")
    add_flags(parser, RUN, all_options())


def _add_simulate_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, metavar="N",
                        help="virtual nodes (default: the scenario's, 8)")
    parser.add_argument("--base-port", type=int, default=9955, metavar="P",
                        help="node i serves on port P+i (default 9955)")
    parser.add_argument("--listen-host", default="127.0.0.1", metavar="HOST",
                        help="address every node binds (default 127.0.0.1)")
    parser.add_argument("--scenario", dest="fleet_scenario", default="healthy",
                        metavar="NAME|FILE", help="fleet scenario: a built-in name (healthy, "
                        "faults, two-jobs, ...) or a YAML file (default healthy)")
    parser.add_argument("--gpus-per-node", type=int, metavar="G",
                        help="GPUs per node (default: the scenario's, 8)")
    add_flags(parser, SIMULATE, all_options())


def _simulate(args: argparse.Namespace) -> int:
    from exporter.fleet import MAX_NODES, Fleet, FleetSettings, load_fleet_scenario

    if args.nodes is not None and not 1 <= args.nodes <= MAX_NODES:
        raise ConfigError(f"--nodes: expected 1-{MAX_NODES}, got {args.nodes}")
    if args.gpus_per_node is not None and not 1 <= args.gpus_per_node <= 64:
        raise ConfigError(f"--gpus-per-node: expected 1-64, got {args.gpus_per_node}")
    options = resolve(args, SIMULATE, all_options())
    scenario = load_fleet_scenario(args.fleet_scenario, args.nodes, args.gpus_per_node)
    if args.base_port < 1 or args.base_port + scenario.nodes - 1 > 65535:
        raise ConfigError(f"--base-port: ports {args.base_port}-"
                          f"{args.base_port + scenario.nodes - 1} are out of range")
    logging.basicConfig(level=str(options["log_level"]).upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fleet = Fleet(scenario, FleetSettings(base_port=args.base_port,
                                          listen_host=args.listen_host, options=options))
    try:
        fleet.start()
    except OSError as exc:
        return fail("simulate", f"cannot start the fleet: {exc.strerror or exc}",
                    EXIT_FAILURE)
    host = f"[{args.listen_host}]" if ":" in args.listen_host else args.listen_host
    print(f"simulating {scenario.nodes} nodes x {scenario.gpus_per_node} GPUs "
          f"(scenario {scenario.name}); targets:", flush=True)
    print(" ".join(f"{host}:{port}" for port in fleet.ports), flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    fleet.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Per-node Prometheus exporter for GPU training "
                     "clusters: high-rate power, swings, stragglers and failing hardware.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    run = commands.add_parser("run", help="sample GPUs and serve /metrics")
    _add_run_flags(run)
    check = commands.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("file", metavar="FILE")
    _add_simulate_flags(commands.add_parser(
        "simulate", help="run a fleet of simulated nodes in one process, one port each"))
    from exporter.offline import analyze, lemons, record

    record.add_arguments(commands.add_parser(
        "record", help="record GPU samples (power at full rate) to a trace file"))
    analyze.add_arguments(commands.add_parser(
        "analyze", help="analyse a trace (ours or an nvidia-smi CSV log) offline"))
    lemons.add_arguments(commands.add_parser(
        "lemons", help="rank nodes and GPUs by how likely they fail again (fault events)"))
    from exporter.tell import command as health

    health.add_arguments(commands.add_parser(
        "health", help="ask the local exporter for its verdict: one line, exit 0 OK, 1 "
        "problem, 2 unknown (node-problem-detector); --slurm-drain drains via scontrol"))
    history = commands.add_parser("history", help="print the episodes stored in a state "
                                  "directory, one JSON line each (docs/history.md)")
    history.add_argument("--storage.path", dest="storage_path", required=True, metavar="DIR",
                         help="the state directory (run's --storage.path)")
    history.add_argument("--format", choices=("jsonl",), default="jsonl",
                         help="output format (default jsonl: the fault-event lines)")
    history.add_argument("--since", type=float, metavar="UNIX_SECONDS",
                         help="only episodes that started at or after this time")
    history.add_argument("--until", type=float, metavar="UNIX_SECONDS",
                         help="only episodes that started before this time")
    history.add_argument("--gpu", metavar="UUID|SERIAL",
                         help="only this GPU's episodes (node: the node's own)")
    return parser


def _did_you_mean(parser: argparse.ArgumentParser, command: str | None,
                  extra: list[str]) -> str:
    """" (did you mean --flag?)" for the first unknown flag close to one of the
    subcommand's, as the config file's unknown keys get."""
    commands = next((a for a in parser._actions
                     if isinstance(a, argparse._SubParsersAction)), None)
    sub = commands.choices.get(command) if commands is not None and command else None
    flags = list(sub._option_string_actions) if sub is not None else []
    for word in extra:
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.75)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


def _history(args: argparse.Namespace) -> int:
    import sqlite3

    from exporter.history.answer import jsonl_lines

    gpu = "" if args.gpu == "node" else args.gpu
    try:
        for line in jsonl_lines(args.storage_path, args.since, args.until, gpu):
            sys.stdout.write(line + "\n")
    except BrokenPipeError:
        return 0
    except (OSError, sqlite3.Error) as exc:
        return fail("history", f"{args.storage_path}: {exc}", EXIT_FAILURE)
    return 0


def tune_interpreter() -> None:
    """Before start: hand the GIL over every 1 ms instead of 5 ms, so a scrape's thread
    is not held up behind a snapshot being rendered (docs/performance.md). The
    benchmarks call it too, to measure what `run` runs."""
    sys.setswitchinterval(0.001)


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
    except StoreBusy as exc:
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
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would name the top-level parser, not the subcommand
        return fail(args.command, f"unrecognized arguments: {' '.join(extra)}"
                    f"{_did_you_mean(parser, args.command, extra)} (see --help)")
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "record":
            from exporter.offline import record

            return record.main(args)
        if args.command == "simulate":
            return _simulate(args)
        if args.command == "analyze":
            from exporter.offline import analyze

            return analyze.main(args)
        if args.command == "lemons":
            from exporter.offline import lemons

            return lemons.main(args)
        if args.command == "history":
            return _history(args)
        if args.command == "check-config":
            return _check_config(args.file)
        if args.command == "health":
            from exporter.tell import command as health

            return health.main(args)
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    except (ConfigError, TraceError) as exc:
        return fail(args.command, str(exc))


if __name__ == "__main__":
    sys.exit(main())
