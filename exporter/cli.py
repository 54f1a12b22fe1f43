"""Command line: run, check-config, analyze, simulate."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from exporter import __version__
from exporter.config import DEFAULT_PORT, build_config, load_config_file
from exporter.gpu.backend import NvmlUnavailable
from exporter.offline.trace import TraceError
from exporter.sim.scenarios import builtin_names, load_scenario
from exporter.web.webconfig import load_web_config
from exporter.yamlfile import ConfigError

PROG = "cluster-telemetry-exporter"
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML config file (flags win over it)")
    parser.add_argument("--web.listen-address", dest="listen_address", metavar="ADDR",
                        help=f"address to serve on (default :{DEFAULT_PORT})")
    parser.add_argument("--web.config.file", dest="web_config_file", metavar="FILE",
                        help="TLS and basic auth, in the Prometheus exporter-toolkit web config "
                        "format (default: plain HTTP, no auth)")
    parser.add_argument("--fake", action="store_true", default=None,
                        help="run on the built-in simulated node instead of real NVML")
    parser.add_argument("--scenario", metavar="NAME|FILE",
                        help="fake scenario: a built-in name (" + ", ".join(builtin_names())
                        + ") or a YAML file; implies nothing without --fake")
    parser.add_argument("--power.sample-rate", dest="power_sample_rate_hz", type=float,
                        metavar="HZ", help="instant-power sampling rate, 1-100 (default 20)")
    parser.add_argument("--sweep.interval", dest="sweep_interval_seconds", type=float,
                        metavar="SECONDS", help="full GPU sweep interval (default 1)")
    parser.add_argument("--health.stale-after", dest="stale_after_seconds", type=float,
                        metavar="SECONDS",
                        help="/healthz turns 503 when sampling is older than this (default 10)")
    parser.add_argument("--path.sysfs", dest="path_sysfs", metavar="DIR",
                        help="sysfs mount point (default /sys)")
    parser.add_argument("--collector.infiniband", dest="collector_infiniband",
                        action=argparse.BooleanOptionalAction, default=None,
                        help="read InfiniBand/RoCE counters from sysfs (default on)")
    parser.add_argument("--collector.host", dest="collector_host",
                        action=argparse.BooleanOptionalAction, default=None,
                        help="CPU, memory, load and network figures through psutil (default on)")
    parser.add_argument("--collector.host.network-exclude", dest="host_network_exclude",
                        metavar="REGEX",
                        help="network interfaces to leave out (default: loopback and "
                        "container/VM interfaces)")
    parser.add_argument("--hpc-job-mapping-dir", dest="hpc_job_mapping_dir", metavar="DIR",
                        help="directory of GPU-to-job files as dcgm-exporter reads them "
                        "(one file per GPU index, one job id per line); unset: off")
    parser.add_argument("--gpus.expected", dest="expected_gpus", type=int, metavar="N",
                        help="GPUs this node should have (default: the count at start)")
    parser.add_argument("--nvml.hang-timeout", dest="hang_timeout_seconds", type=float,
                        metavar="SECONDS", help="an NVML call this long marks its GPU hung "
                        "and sampling goes on without it (default 2)")
    parser.add_argument("--straggler.persistence", dest="straggler_persistence_seconds",
                        type=float, metavar="SECONDS",
                        help="how long a GPU must deviate from its peers (default 300)")
    parser.add_argument("--sweep.health-interval", dest="gpu_health_interval_seconds",
                        type=float, metavar="SECONDS", help="how often ECC, row remapping "
                        "and NVLink counters are read (default 5)")
    parser.add_argument("--replay", metavar="FILE", help="serve a recorded trace (ours or an "
                        "nvidia-smi CSV log) as if live, looping at its end")
    parser.add_argument("--speed", dest="replay_speed", type=float, metavar="X",
                        help="replay speed (default 1)")
    parser.add_argument("--log.level", dest="log_level",
                        choices=["debug", "info", "warning", "error"], help="default info")


def _add_simulate_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, metavar="N",
                        help="virtual nodes (default: the scenario's, 8)")
    parser.add_argument("--base-port", type=int, default=9955, metavar="P",
                        help="node i serves on port P+i (default 9955)")
    parser.add_argument("--listen-host", default="127.0.0.1", metavar="HOST",
                        help="address every node binds (default 127.0.0.1)")
    parser.add_argument("--scenario", default="healthy", metavar="NAME|FILE",
                        help="fleet scenario: a built-in name (healthy, faults, two-jobs, ...) "
                        "or a YAML file (default healthy)")
    parser.add_argument("--gpus-per-node", type=int, metavar="G",
                        help="GPUs per node (default: the scenario's, 8)")
    parser.add_argument("--power.sample-rate", dest="power_sample_rate_hz", type=float,
                        default=5.0, metavar="HZ",
                        help="instant-power sampling rate per node (default 5: light)")
    parser.add_argument("--sweep.interval", dest="sweep_interval_seconds", type=float,
                        default=1.0, metavar="SECONDS",
                        help="full GPU sweep interval per node (default 1)")
    parser.add_argument("--straggler.persistence", dest="straggler_persistence_seconds",
                        type=float, default=300.0, metavar="SECONDS",
                        help="how long a GPU must deviate from its peers (default 300)")
    parser.add_argument("--log.level", dest="log_level", default="info",
                        choices=["debug", "info", "warning", "error"], help="default info")


def _simulate(args: argparse.Namespace) -> int:
    from exporter.sim.fleet import MAX_NODES, Fleet, FleetSettings, load_fleet_scenario

    if args.nodes is not None and not 1 <= args.nodes <= MAX_NODES:
        raise ConfigError(f"--nodes: expected 1-{MAX_NODES}, got {args.nodes}")
    if args.gpus_per_node is not None and not 1 <= args.gpus_per_node <= 64:
        raise ConfigError(f"--gpus-per-node: expected 1-64, got {args.gpus_per_node}")
    if not 1 <= args.power_sample_rate_hz <= 100:
        raise ConfigError("--power.sample-rate: expected 1-100")
    if not 0.1 <= args.sweep_interval_seconds <= 60:
        raise ConfigError("--sweep.interval: expected 0.1-60")
    if not 0 <= args.straggler_persistence_seconds <= 86400:
        raise ConfigError("--straggler.persistence: expected 0-86400")
    scenario = load_fleet_scenario(args.scenario, args.nodes, args.gpus_per_node)
    if args.base_port < 1 or args.base_port + scenario.nodes - 1 > 65535:
        raise ConfigError(f"--base-port: ports {args.base_port}-"
                          f"{args.base_port + scenario.nodes - 1} are out of range")
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fleet = Fleet(scenario, FleetSettings(
        base_port=args.base_port, listen_host=args.listen_host,
        power_sample_rate_hz=args.power_sample_rate_hz,
        sweep_interval_seconds=args.sweep_interval_seconds,
        straggler_persistence_seconds=args.straggler_persistence_seconds))
    try:
        fleet.start()
    except OSError as exc:
        print(f"{PROG}: cannot start the fleet on {args.listen_host}:{args.base_port}+: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
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
    from exporter.offline import analyze, record

    record.add_arguments(commands.add_parser(
        "record", help="record GPU samples (power at full rate) to a trace file"))
    analyze.add_arguments(commands.add_parser(
        "analyze", help="analyse a trace (ours or an nvidia-smi CSV log) offline"))
    return parser


def _run(args: argparse.Namespace) -> int:
    from exporter.app import Exporter  # imported here so --help stays fast
    from exporter.service import Signals, serve

    keys = ("listen_address", "web_config_file", "fake", "scenario", "power_sample_rate_hz",
            "sweep_interval_seconds", "stale_after_seconds", "path_sysfs", "collector_infiniband",
            "collector_host", "host_network_exclude", "hpc_job_mapping_dir", "expected_gpus",
            "hang_timeout_seconds", "straggler_persistence_seconds", "replay", "replay_speed",
            "gpu_health_interval_seconds",
            "log_level")
    overrides = {k: getattr(args, k) for k in keys}
    config = build_config(args.config, overrides)
    if config.fake:
        load_scenario(config.scenario)  # an unknown scenario is a usage error, before anything
    logging.basicConfig(level=config.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Hand the GIL over every 1 ms instead of 5 ms, so a scrape's thread is not held up
    # behind a snapshot being rendered (scrape p99 8 -> see docs/performance.md).
    sys.setswitchinterval(0.001)
    signals = Signals()  # before start: a SIGHUP then must not kill us (its default)
    exporter = Exporter(config)
    try:
        exporter.start()
    except NvmlUnavailable as exc:
        print(f"{PROG}: {exc}. This machine has no usable NVIDIA driver. To try the exporter "
              f"on a simulated node, run: {PROG} run --fake", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{PROG}: cannot listen on {config.listen_address}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    serve(exporter, signals, args.config, overrides)  # until SIGINT/SIGTERM; SIGHUP reloads
    exporter.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
        if args.command == "check-config":
            config = load_config_file(args.file)
            web = load_web_config(config.web_config_file)
            security = ("TLS" if web.tls else "plain HTTP") + (
                f", basic auth for {len(web.users)} user(s)" if web.auth else "")
            print(f"{args.file}: ok (listen {config.listen_address}, {security}, "
                  f"power {config.power_sample_rate_hz:g} Hz, "
                  f"sweep {config.sweep_interval_seconds:g} s)")
            return 0
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    except (ConfigError, TraceError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
