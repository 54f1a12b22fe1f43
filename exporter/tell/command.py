"""`cluster-telemetry-exporter health`: the command line (see exporter/tell/__init__.py).

    health [--config FILE | --web.listen-address ADDR --web.config.file FILE]
           [--format line|json] [--fail-on failed|warning] [--timeout SECONDS]
           [--auth.username NAME --auth.password-file FILE]
           [--tls.client-cert FILE --tls.client-key FILE]
           [--slurm-drain [--slurm.node-name NAME] [--slurm.reason-prefix TEXT]]

Without --slurm-drain it exits 0 (OK), 1 (a problem) or 2 (unknown: the exporter cannot
be reached, is not ready, or the config is wrong), node-problem-detector's convention.
With --slurm-drain it exits 0 once it did what the verdict needs (a stopped exporter and
a wrong config included: nothing is drained then), and 1 only when a drain was needed
and scontrol failed: some Slurm versions run HealthCheckProgram at slurmd's start until
it exits 0 and hold the node's registration until then.
"""

from __future__ import annotations

import argparse
import json

from exporter.config import all_options, build_config
from exporter.health.model import FAILED, UNKNOWN
from exporter.options import HEALTH, add_flags, positive
from exporter.tell import client, slurm
from exporter.tell.verdict import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNKNOWN,
    FAIL_ON,
    NotAVerdict,
    Verdict,
    cut,
    parse,
)
from exporter.yamlfile import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="the exporter's YAML config file: "
                        "its listen address and web config (flags win over it)")
    add_flags(parser, HEALTH, all_options())
    parser.add_argument("--format", choices=("line", "json"), default="line",
                        help="one line (default), or one JSON object for scripts")
    parser.add_argument("--fail-on", choices=FAIL_ON, default=FAILED,
                        help="the node state that is a problem (exit 1) besides an action "
                        "for the node (reset_gpu, reboot_node, drain_and_service); "
                        "default failed")
    parser.add_argument("--timeout", type=positive, default=5.0, metavar="SECONDS",
                        help="how long to wait for the exporter (default 5)")
    parser.add_argument("--auth.username", dest="auth_username", metavar="NAME",
                        help="basic-auth user, where the web config asks for one")
    parser.add_argument("--auth.password-file", dest="auth_password_file", metavar="FILE",
                        help="file holding that user's password (never a flag: ps shows "
                        "flags)")
    parser.add_argument("--tls.client-cert", dest="client_cert", metavar="FILE",
                        help="client certificate, where the web config requires one")
    parser.add_argument("--tls.client-key", dest="client_key", metavar="FILE",
                        help="its private key (unset: in the certificate's file)")
    parser.add_argument("--slurm-drain", action="store_true",
                        help="drain the node with scontrol when its action needs it (a "
                        "reboot, a service, or a GPU reset while jobs run); never resumes")
    parser.add_argument("--slurm.node-name", dest="slurm_node", metavar="NAME",
                        help="the node's Slurm name (default $SLURMD_NODENAME, else the "
                        "short host name)")
    parser.add_argument("--slurm.reason-prefix", dest="slurm_prefix",
                        default=slurm.DEFAULT_PREFIX, metavar="TEXT",
                        help="starts the drain reason, and tells our drains from others' "
                        f"(default {slurm.DEFAULT_PREFIX})")
    parser.add_argument("--slurm.scontrol", dest="scontrol", default="scontrol",
                        metavar="PATH", help="the scontrol program (default: scontrol on "
                        "PATH)")


def _target(args: argparse.Namespace) -> client.Target:
    overrides = {o.key: getattr(args, o.key) for o in all_options()
                 if o.flag is not None and HEALTH in o.commands}
    serving = build_config(args.config, overrides).serving
    host, port = serving.host_port
    if port == 0:
        raise ConfigError(f"--web.listen-address {serving.listen_address}: port 0 is "
                          "chosen at start; give the exporter's port")
    if not args.slurm_prefix.strip() or ":" in args.slurm_prefix:
        raise ConfigError("--slurm.reason-prefix: expected a short word without ':'")
    return client.Target(client.connect_host(host), port,
                         client.tls_context(serving.web_config_file, args.client_cert,
                                            args.client_key),
                         client.authorization(args.auth_username, args.auth_password_file),
                         args.timeout)


def _ask(target: client.Target) -> tuple[Verdict | None, str]:
    """(the verdict, its line) or (None, why it is unknown)."""
    try:
        verdict = parse(client.ask(target))
    except client.Unreachable as exc:
        return None, cut(f"unknown: {exc}")
    except NotAVerdict as exc:
        return None, cut(f"unknown: {target.url} answered no verdict: {exc}")
    return verdict, verdict.line()


def main(args: argparse.Namespace) -> int:
    try:
        target = _target(args)
    except ConfigError as exc:
        if not args.slurm_drain:
            raise  # one line on stderr, exit 2: unknown
        # HealthCheckProgram: a wrong config must not hold slurmd's registration back
        print(cut(f"unknown: {exc}; slurm: nothing done"), flush=True)
        return EXIT_OK
    verdict, line = _ask(target)
    code = verdict.exit_code(args.fail_on) if verdict is not None else EXIT_UNKNOWN
    outcome = None
    if args.slurm_drain:
        if verdict is None or verdict.state == UNKNOWN:
            outcome = slurm.Outcome("slurm: nothing done (no verdict)")
        else:
            node = args.slurm_node or slurm.default_node_name()
            outcome = slurm.drain(verdict, node, slurm.Scontrol(args.scontrol),
                                  args.slurm_prefix)
        code = EXIT_PROBLEM if outcome.failed else EXIT_OK
    if args.format == "json":
        print(json.dumps({
            "exit_code": code, "line": line, "url": target.url,
            "verdict": verdict.answer if verdict is not None else None,
            "slurm": None if outcome is None else {
                "detail": outcome.detail, "drained": outcome.drained,
                "failed": outcome.failed, "command": list(outcome.command)}},
            ensure_ascii=False), flush=True)
    else:
        print(line if outcome is None else cut(f"{line}; {outcome.detail}", 600), flush=True)
    return code


__all__ = ["EXIT_OK", "EXIT_PROBLEM", "EXIT_UNKNOWN", "add_arguments", "main"]
