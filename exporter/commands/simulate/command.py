"""`cluster-telemetry-exporter simulate`: the command line (see this package's __init__.py)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from exporter.config import all_options
from exporter.errors import EXIT_FAILURE, fail
from exporter.options import SIMULATE, add_flags, resolve
from exporter.yamlfile import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
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


def main(args: argparse.Namespace) -> int:
    # here, not at the top: cli.py builds every command's parser, and the runner brings
    # in the whole exporter
    from exporter.commands.simulate.runner import Fleet, FleetSettings
    from exporter.commands.simulate.scenario import MAX_NODES, load_fleet_scenario

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
