"""`cluster-telemetry-exporter health`: the command line (see this package's __init__.py).

    health [--config FILE | --url URL | --web.listen-address ADDR --web.config.file FILE]
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
import ssl
import sys
import urllib.parse
from collections.abc import Sequence

from exporter.commands.health import client, slurm
from exporter.commands.health.verdict import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNKNOWN,
    FAIL_ON,
    NotAVerdict,
    Verdict,
    cut,
    parse,
)
from exporter.errors import PROG, fail
from exporter.health.model import FAILED, UNKNOWN
from exporter.options import (
    DEFAULT_PORT,
    HEALTH,
    Option,
    add_flags,
    build,
    options_of,
    positive,
)
from exporter.web.settings import ServingSettings
from exporter.yamlfile import ConfigError


def _options() -> list[Option]:
    """The settings health shares with run: the listen address and the web config."""
    return [o for o in options_of(ServingSettings) if HEALTH in o.commands]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="the exporter's YAML config file: "
                        "its listen address and web config (flags win over it)")
    add_flags(parser, HEALTH, _options())
    parser.add_argument("--url", metavar="URL", help="the exporter as a URL, "
                        f"http://HOST[:PORT] or https://HOST[:PORT] (default port {DEFAULT_PORT}), "
                        "instead of --web.listen-address; a path other than /api/v1/health "
                        "is refused")
    parser.add_argument("--format", choices=("line", "json"), default="line",
                        help="one line (default), or one JSON object for scripts")
    parser.add_argument("--fail-on", choices=FAIL_ON, default=FAILED,
                        help="the node state that is a problem (exit 1) besides an action "
                        "for the node (reset_gpu, reboot_node, drain_and_service); "
                        "default failed")
    parser.add_argument("--timeout", type=positive, default=5.0, metavar="SECONDS",
                        help="the most the whole exchange with the exporter may take (connect, "
                        "request, the full answer; default 5); past it: unknown")
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


def url_address(url: str) -> tuple[str, str]:
    """(scheme, listen address HOST:PORT) of --url; ConfigError for a URL health cannot
    ask (another scheme, no host, a path, a query, credentials: those are flags)."""
    parts = urllib.parse.urlsplit(url.strip())
    scheme = parts.scheme.lower()
    shown = url if parts.password is None else url.replace(parts.password, "***")
    if scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"--url {shown[:100]!r}: expected http://HOST:PORT or "
                          "https://HOST:PORT")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(f"--url {shown[:100]!r}: no credentials in the URL: give "
                          "--auth.username and --auth.password-file")
    if parts.path.rstrip("/") not in ("", client.PATH):
        raise ConfigError(f"--url {shown[:100]!r}: a path other than {client.PATH} (health "
                          "asks that one): give the exporter's address, http://HOST:PORT")
    if parts.query or parts.fragment:
        raise ConfigError(f"--url {shown[:100]!r}: no query or fragment: give the exporter's "
                          "address, http://HOST:PORT")
    try:
        port = parts.port if parts.port is not None else DEFAULT_PORT
    except ValueError:
        raise ConfigError(f"--url {shown[:100]!r}: the port must be 1-65535") from None
    host = parts.hostname or ""
    if not host:
        raise ConfigError(f"--url {shown[:100]!r}: no host")
    return scheme, f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _serving(args: argparse.Namespace) -> ServingSettings:
    """The listen address and web config: from the config file, checked whole as `run`
    checks it, with the flags over it; from the flags alone without a file (then
    nothing but these two settings is loaded: a run costs a quarter of the CPU)."""
    given = {o.key: getattr(args, o.key) for o in _options()
             if getattr(args, o.key, None) is not None}
    if args.url is not None:
        if "listen_address" in given:
            raise ConfigError("--url and --web.listen-address both name the exporter: give "
                              "one of --url and --web.listen-address")
        given["listen_address"] = url_address(args.url)[1]
    if args.config:
        from exporter.config import build_config  # the whole config, every collector's

        return build_config(args.config, given).serving
    for option in _options():
        problem = option.problem(given.get(option.key, option.default))
        if problem:
            raise ConfigError(f"{option.flag} (config key {option.key}): {problem}")
    return build(ServingSettings, given)


def _tls(args: argparse.Namespace, serving: ServingSettings) -> ssl.SSLContext | None:
    """The web config's TLS (the served certificate pinned); with --url, its scheme must
    agree, and https without a web config that serves TLS trusts the system's CAs."""
    context = client.tls_context(serving.web_config_file, args.client_cert, args.client_key) \
        if args.url is None or serving.web_config_file else None
    if args.url is None:
        return context
    scheme = url_address(args.url)[0]
    if scheme == "http" and context is not None:
        raise ConfigError(f"--url {args.url}: the web config serves TLS: write https://")
    if scheme == "https" and context is None:
        if serving.web_config_file:
            raise ConfigError(f"--url {args.url}: the web config serves plain HTTP: write "
                              "http://")
        return client.system_tls_context(args.client_cert, args.client_key)
    return context


def _target(args: argparse.Namespace) -> client.Target:
    serving = _serving(args)
    host, port = serving.host_port
    if port == 0:
        raise ConfigError(f"--web.listen-address {serving.listen_address}: port 0 is "
                          "chosen at start; give the exporter's port")
    if not args.slurm_prefix.strip() or ":" in args.slurm_prefix:
        raise ConfigError("--slurm.reason-prefix: expected a short word without ':'")
    return client.Target(client.connect_host(host), port, _tls(args, serving),
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
        if args.slurm_drain:
            # HealthCheckProgram: a wrong config must not hold slurmd's registration back
            print(cut(f"unknown: {exc}; slurm: nothing done"), flush=True)
            return EXIT_OK
        # stdout is node-problem-detector's condition message; stderr the usual line
        print(cut(f"unknown: {exc}"), flush=True)
        return fail("health", str(exc), EXIT_UNKNOWN)
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


class _Parser(argparse.ArgumentParser):
    """A bad flag: one line and exit 2 (unknown), as every subcommand says it."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.exit(fail("health", f"{message} (see --help)"))


def run(argv: Sequence[str]) -> int:
    """`cluster-telemetry-exporter health ARGS`, straight from exporter/entry.py: the
    sampler, the collectors and numpy are never imported."""
    parser = _Parser(prog=f"{PROG} health", description="Ask the local exporter for its "
                     "verdict: one line, exit 0 OK, 1 problem, 2 unknown.")
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    try:
        return main(args)
    except ConfigError as exc:
        return fail("health", str(exc))


__all__ = ["EXIT_OK", "EXIT_PROBLEM", "EXIT_UNKNOWN", "add_arguments", "main", "run"]
