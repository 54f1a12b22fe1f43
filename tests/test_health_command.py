"""`cluster-telemetry-exporter health`, against real exporters on the fake, on loopback.

Exit codes by node-problem-detector's convention (0 OK, 1 problem, 2 unknown) for a
healthy node, a failing GPU, a warning, a stopped exporter and answers that are no
verdict; TLS and basic auth from the same web config as `run`; `--slurm-drain` with a
fake `scontrol` first on PATH that records its arguments and answers `show node` with
the state the test gives it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from exporter.cli import main
from tests.certs import make_certs
from tests.tools import ExporterFactory, require_module

# XID 94 (contained ECC error): DCGM warns, the catalog asks to restart the application
WARNING_SCENARIO = """
description: GPU 1 reports XID 94 at t=2 s.
gpus: 4
workload: {type: training}
events:
  - {kind: xid, at: 2, gpu: 1, code: 94}
"""


@pytest.fixture(scope="module")
def exporters(tmp_path_factory):
    """Real exporters on the fake by scenario, each advanced past its faults."""
    warning = tmp_path_factory.mktemp("scenario") / "xid94.yaml"
    warning.write_text(WARNING_SCENARIO)
    factory = ExporterFactory()
    found = {}
    try:
        for name, scenario in (("healthy", "training"), ("lost", "gpu-lost"),
                               ("reset", "ecc-dbe"), ("warning", str(warning))):
            exporter = factory.start(manual=True, scenario=scenario)
            exporter.sampler.advance(16)
            found[name] = exporter
        yield found
    finally:
        factory.stop_all()


def health(capsys, port: int | None, *flags: str) -> tuple[int, str]:
    address = [f"--web.listen-address=127.0.0.1:{port}"] if port is not None else []
    code = main(["health", *address, *flags])
    out = capsys.readouterr().out
    return code, out


def test_a_healthy_node_exits_0_with_one_line(exporters, capsys):
    code, out = health(capsys, exporters["healthy"].port)
    assert code == 0
    assert out.count("\n") == 1 and out.startswith("ok: 8 GPUs judged (8 ok)")


def test_a_failing_gpu_exits_1_naming_the_action_and_the_reason(exporters, capsys):
    code, out = health(capsys, exporters["lost"].port)
    assert code == 1
    assert out.count("\n") == 1
    assert out.startswith("failed: reboot_node: GPU 5: GPU lost")
    code, out = health(capsys, exporters["reset"].port)
    assert code == 1 and out.startswith("failed: reset_gpu: GPU 2:")


def test_a_warning_is_no_problem_unless_asked(exporters, capsys):
    code, out = health(capsys, exporters["warning"].port)
    assert code == 0 and out.startswith("warning: restart_application: GPU 1: XID 94")
    code, _ = health(capsys, exporters["warning"].port, "--fail-on", "warning")
    assert code == 1


def test_a_stopped_exporter_exits_2(capsys):
    factory = ExporterFactory()
    exporter = factory.start(manual=True)
    port = exporter.port
    factory.stop_all()
    code, out = health(capsys, port, "--timeout", "2")
    assert code == 2
    assert out.startswith(f"unknown: cannot reach the exporter at http://127.0.0.1:{port}/")
    code, out = health(capsys, port, "--timeout", "2", "--format", "json")
    answer = json.loads(out)
    assert code == answer["exit_code"] == 2 and answer["verdict"] is None
    assert answer["line"].startswith("unknown: cannot reach")


def test_json_for_scripts_carries_the_exporters_answer(exporters, capsys):
    code, out = health(capsys, exporters["lost"].port, "--format", "json")
    answer = json.loads(out)
    assert code == answer["exit_code"] == 1
    assert answer["verdict"]["gpus"]["5"]["action"] == "reboot_node"
    assert answer["verdict"]["gpus"]["0"]["state"] == "ok"
    assert answer["line"].startswith("failed: reboot_node:") and answer["slurm"] is None


def test_the_listen_address_comes_from_the_config_file(exporters, capsys, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"listen_address: ':{exporters['lost'].port}'\n")
    code, out = health(capsys, None, "--config", str(config))
    assert code == 1 and out.startswith("failed: reboot_node")
    # a flag wins over the file, as for run
    code, _ = health(capsys, exporters["healthy"].port, "--config", str(config))
    assert code == 0


def test_bad_config_is_one_line_and_unknown(capsys, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("listen_address: nowhere\n")
    assert main(["health", "--config", str(config)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("cluster-telemetry-exporter: health: ") and err.count("\n") == 1
    # the condition's message too (node-problem-detector reads stdout)
    assert out.startswith("unknown: ") and "listen_address" in out and out.count("\n") == 1
    assert main(["health", "--web.listen-address", "127.0.0.1:0"]) == 2
    assert "port 0" in capsys.readouterr().err


# -- answers that are no verdict -----------------------------------------------------------

class _Canned(BaseHTTPRequestHandler):
    status, body = 200, b""

    def do_GET(self):  # noqa: N802 - the stdlib's name
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status, body, says", [
    (503, b"no snapshot yet\n", "is not ready (HTTP 503)"),
    (404, b"not found\n", "not found (an exporter without health checks?)"),
    (200, b"<html>", "answered no verdict: not JSON"),
    (200, b'{"node": {"state": "fine", "action": "none", "reasons": ""}}',
     "node.state is 'fine'"),
    (200, b'{"node": {"state": "ok", "action": "panic", "reasons": ""}}',
     "node.action is 'panic'"),
    (200, b'{"gpus": {}}', "node is not an object"),
    (200, b'{"node": {"state": "ok", "action": "none", "reasons": ""}, "gpus": {"x": {}}}',
     "not a GPU index"),
    (200, b'{"node": {"state": "unknown", "action": "none", "reasons": "no verdict yet",'
     b' "checks": []}, "gpus": {}}', "unknown: none: no verdict yet"),
])
def test_anything_but_a_verdict_is_unknown_never_a_problem(capsys, status, body, says):
    handler = type("Handler", (_Canned,), {"status": status, "body": body})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        code, out = health(capsys, server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
    assert code == 2 and out.startswith("unknown: ") and says in out


# -- TLS and basic auth, from the web config -----------------------------------------------

USER, PASSWORD = "npd", "a long enough passphrase"


def test_tls_and_basic_auth_from_the_same_web_config(tmp_path, capsys):
    bcrypt = require_module("bcrypt")
    certs = make_certs(tmp_path / "certs")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {certs.server_cert}\n"
                   f"  key_file: {certs.server_key}\nbasic_auth_users:\n  {USER}: '{hashed}'\n")
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")
    factory = ExporterFactory()
    try:
        exporter = factory.start(manual=True, scenario="gpu-lost", web_config_file=str(web))
        exporter.sampler.advance(16)
        flags = ("--web.config.file", str(web))
        code, out = health(capsys, exporter.port, *flags)
        assert code == 2 and "asks for basic auth" in out and "https://" in out
        # the exporter warns about a loose key at its start; the plugin, run as a program
        # every 30 s, does not
        certs.server_key.chmod(0o644)
        result = subprocess.run([ENTRY_POINT, "health", f"--web.listen-address=127.0.0.1:"
                                 f"{exporter.port}", *flags, "--auth.username", USER,
                                 "--auth.password-file", str(password)],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 1 and result.stdout.startswith("failed: reboot_node")
        assert result.stderr == ""
        wrong = tmp_path / "wrong"
        wrong.write_text("not it")
        code, out = health(capsys, exporter.port, *flags, "--auth.username", USER,
                           "--auth.password-file", str(wrong))
        assert code == 2 and "refused the credentials" in out
        # another server's certificate is not the one served: no verdict from it
        other = tmp_path / "other.yml"
        other.write_text(f"tls_server_config:\n  cert_file: {certs.client_cert}\n"
                         f"  key_file: {certs.client_key}\n")
        code, out = health(capsys, exporter.port, "--web.config.file", str(other),
                           "--auth.username", USER, "--auth.password-file", str(password))
        assert code == 2 and "CERTIFICATE_VERIFY_FAILED" in out
    finally:
        factory.stop_all()


# -- --slurm-drain, with a fake scontrol ---------------------------------------------------

FAKE_SCONTROL = """#!/bin/sh
# records its arguments (one JSON list a line), answers `show node`, exits as told
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$SCONTROL_LOG"
if [ "$1" = show ]; then cat "$SCONTROL_NODE"; fi
if [ "$1" = update ]; then exit "${SCONTROL_UPDATE_EXIT:-0}"; fi
"""


class FakeSlurm:
    def __init__(self, directory: Path, monkeypatch):
        bin_dir = directory / "bin"
        bin_dir.mkdir()
        program = bin_dir / "scontrol"
        program.write_text(FAKE_SCONTROL)
        program.chmod(0o755)
        self.log, self.node = directory / "calls", directory / "node"
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        monkeypatch.setenv("SCONTROL_LOG", str(self.log))
        monkeypatch.setenv("SCONTROL_NODE", str(self.node))
        monkeypatch.setenv("SLURMD_NODENAME", "gpu-a17")
        self.state("IDLE")

    def state(self, state: str, reason: str | None = None) -> None:
        text = f"NodeName=gpu-a17 Arch=x86_64 CoresPerSocket=48 State={state} Gres=gpu:8"
        if reason is not None:
            text += f" Reason={reason} [root@2026-12-01T20:00:00]"
        self.node.write_text(text + "\n")

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls() if c[0] == "update"]


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    return FakeSlurm(tmp_path, monkeypatch)


LOST_REASON = ("Reason=cte: reboot_node: GPU 5: GPU lost (fell off the bus), XID 79 "
               "(GPU has fallen off the bus)")


def test_slurm_drain_drains_a_failing_node(exporters, slurm, capsys):
    slurm.state("MIXED")
    code, out = health(capsys, exporters["lost"].port, "--slurm-drain")
    assert code == 0  # HealthCheckProgram: done what was needed
    assert slurm.updates() == [["update", "NodeName=gpu-a17", "State=DRAIN", LOST_REASON]]
    assert out.count("\n") == 1 and "slurm: drained gpu-a17" in out


@pytest.mark.parametrize("name", ["healthy", "warning"])
def test_slurm_drain_does_nothing_on_ok_or_a_warning(exporters, slurm, capsys, name):
    slurm.state("MIXED")
    code, out = health(capsys, exporters[name].port, "--slurm-drain")
    assert code == 0 and slurm.calls() == []
    assert "slurm: nothing to drain" in out


def test_a_gpu_reset_drains_only_while_jobs_run(exporters, slurm, capsys):
    slurm.state("IDLE")
    code, out = health(capsys, exporters["reset"].port, "--slurm-drain")
    assert code == 0 and slurm.updates() == [] and "runs no job" in out
    slurm.state("MIXED")
    health(capsys, exporters["reset"].port, "--slurm-drain", "--slurm.node-name", "gpu-b02")
    (update,) = slurm.updates()
    assert update[:3] == ["update", "NodeName=gpu-b02", "State=DRAIN"]
    assert update[3].startswith("Reason=cte: reset_gpu: GPU 2:")
    assert ["show", "node", "gpu-b02", "--oneliner"] in slurm.calls()


def test_a_drain_by_someone_else_is_kept_and_ours_not_repeated(exporters, slurm, capsys):
    slurm.state("IDLE+DRAIN", "fan replaced, burn-in")
    code, out = health(capsys, exporters["lost"].port, "--slurm-drain")
    assert code == 0 and slurm.updates() == [] and "already drained by someone else" in out
    slurm.state("MIXED+DRAIN", LOST_REASON.removeprefix("Reason="))
    code, out = health(capsys, exporters["lost"].port, "--slurm-drain")
    assert code == 0 and slurm.updates() == [] and "already drained for this reason" in out
    # ours, for an older reason: updated to the current one
    slurm.state("DRAINED", "cte: reset_gpu: GPU 2: XID 48")
    health(capsys, exporters["lost"].port, "--slurm-drain")
    assert [u[3] for u in slurm.updates()] == [LOST_REASON]


def test_slurm_drain_never_drains_on_an_unknown_verdict(slurm, capsys):
    factory = ExporterFactory()
    port = factory.start(manual=True).port
    factory.stop_all()
    code, out = health(capsys, port, "--slurm-drain", "--timeout", "2")
    assert code == 0 and slurm.calls() == []
    assert out.startswith("unknown: cannot reach") and "slurm: nothing done" in out


def test_a_failed_drain_exits_1(exporters, slurm, capsys, monkeypatch):
    monkeypatch.setenv("SCONTROL_UPDATE_EXIT", "1")
    code, out = health(capsys, exporters["lost"].port, "--slurm-drain")
    assert code == 1 and "could not drain gpu-a17" in out


def test_no_scontrol_is_a_failed_drain(exporters, capsys, tmp_path):
    code, out = health(capsys, exporters["lost"].port, "--slurm-drain",
                       "--slurm.scontrol", str(tmp_path / "missing"), "--slurm.node-name", "n1")
    assert code == 1 and "not found" in out


def test_slurm_drain_on_a_wrong_config_does_nothing_and_exits_0(slurm, capsys, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("listen_adress: ':9955'\n")
    code, out = health(capsys, None, "--config", str(config), "--slurm-drain")
    assert code == 0 and slurm.calls() == []
    assert out.startswith("unknown: ") and "listen_adress" in out


# -- deploy/slurm/health-check.sh: the HealthCheckProgram ------------------------------------

HEALTH_CHECK = Path(__file__).resolve().parent.parent / "deploy" / "slurm" / "health-check.sh"
ENTRY_POINT = str(Path(sys.executable).parent / "cluster-telemetry-exporter")


def run_health_check(env: dict[str, str]) -> subprocess.CompletedProcess:
    # as slurmd runs it: no arguments, and a short time (it kills it after 60 s)
    return subprocess.run([str(HEALTH_CHECK)], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)


def test_the_health_check_program_drains_through_the_config_file(exporters, slurm, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"listen_address: '127.0.0.1:{exporters['lost'].port}'\n")
    slurm.state("ALLOCATED")
    result = run_health_check({"CTE_BIN": ENTRY_POINT, "CTE_CONFIG": str(config)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert slurm.updates() == [["update", "NodeName=gpu-a17", "State=DRAIN", LOST_REASON]]
    assert "slurm: drained gpu-a17" in result.stdout


def test_the_health_check_program_never_holds_slurmd_back(slurm, tmp_path):
    # the exporter not installed, or not running: exit 0, nothing drained
    result = run_health_check({"CTE_BIN": str(tmp_path / "missing")})
    assert result.returncode == 0 and "not installed" in result.stdout
    config = tmp_path / "config.yaml"
    config.write_text("listen_address: '127.0.0.1:1'\n")
    result = run_health_check({"CTE_BIN": ENTRY_POINT, "CTE_CONFIG": str(config),
                               "CTE_HEALTH_ARGS": "--timeout 2"})
    assert result.returncode == 0 and result.stdout.startswith("unknown: cannot reach")
    result = run_health_check({"CTE_BIN": ENTRY_POINT, "CTE_HEALTH_ARGS": "--timout 2"})
    assert result.returncode == 0 and "unrecognized arguments: --timout" in result.stdout
    assert slurm.calls() == []


# -- what scontrol says, parsed ---------------------------------------------------------------

@pytest.mark.parametrize("text, states, reason, jobs, drained", [
    ("NodeName=a State=MIXED ThreadsPerCore=2", {"MIXED"}, "", True, False),
    ("NodeName=a State=IDLE+DRAIN Reason=bad fan [root@2026-12-01T10:00:00] Comment=x",
     {"IDLE", "DRAIN"}, "bad fan", False, True),
    ("NodeName=a State=ALLOCATED+COMPLETING Reason=(null)",
     {"ALLOCATED", "COMPLETING"}, "", True, False),
    ("NodeName=a State=DOWN*+DRAIN Reason=Not responding [slurm@2026-12-01T10:00:00]",
     {"DOWN", "DRAIN"}, "Not responding", False, True),
    ("NodeName=a State=DRAINED", {"DRAINED"}, "", False, True),
    # the multi-line form (without --oneliner)
    ("NodeName=a Arch=x86_64\n   State=MIXED+DRAIN ThreadsPerCore=2\n"
     "   Reason=cte: reboot_node: GPU 5: lost [root@2026-12-01T10:00:00]\n   Comment=(null)\n",
     {"MIXED", "DRAIN"}, "cte: reboot_node: GPU 5: lost", True, True),
])
def test_scontrol_show_node_is_read(text, states, reason, jobs, drained):
    from exporter.commands.health.slurm import parse_node

    node = parse_node(text)
    assert node is not None
    assert (set(node.states), node.reason, node.jobs_run, node.drained) == (
        states, reason, jobs, drained)


def test_no_state_is_no_answer():
    from exporter.commands.health.slurm import parse_node

    assert parse_node("slurm_load_node error: Invalid node name specified") is None


@pytest.mark.parametrize("listen, host, url", [
    ("", "127.0.0.1", "http://127.0.0.1:9955/api/v1/health"),
    ("0.0.0.0", "127.0.0.1", "http://127.0.0.1:9955/api/v1/health"),
    ("::", "::1", "http://[::1]:9955/api/v1/health"),
    ("10.1.2.3", "10.1.2.3", "http://10.1.2.3:9955/api/v1/health"),
])
def test_every_address_is_asked_on_loopback(listen, host, url):
    from exporter.commands.health.client import Target, connect_host

    assert connect_host(listen) == host
    assert Target(host, 9955).url == url


def test_the_program_answers_health_without_loading_the_sampler(exporters, capsys):
    """The installed program runs `health` straight from exporter/entry.py: the same line
    and exit code as through the full command line, with neither numpy nor the sampler,
    collectors or config imported."""
    port = exporters["lost"].port
    code = ("import runpy, sys; sys.argv = ['cte', 'health', '--web.listen-address="
            f"127.0.0.1:{port}']\n"
            "try:\n    runpy.run_module('exporter.entry', run_name='__main__')\n"
            "except SystemExit as exc:\n"
            "    loaded = [m for m in ('numpy', 'exporter.sampling', 'exporter.collectors',"
            " 'exporter.config', 'exporter.cli') if m in sys.modules]\n"
            "    print(exc.code, loaded)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    line, summary = result.stdout.splitlines()
    assert summary == "1 []", result.stderr
    assert (1, line + "\n") == health(capsys, port)


# -- --url, the address as people write it ---------------------------------------------------

def test_the_exporter_can_be_named_by_its_url(exporters, capsys):
    port = exporters["lost"].port
    for url in (f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/",
                f"http://127.0.0.1:{port}/api/v1/health", f"HTTP://localhost:{port}"):
        code, out = health(capsys, None, "--url", url)
        assert code == 1 and out.startswith("failed: reboot_node"), (url, out)
    # the old flag still works, alone
    assert health(capsys, port)[0] == 1


@pytest.mark.parametrize("url, says", [
    ("http://127.0.0.1:9955/metrics", "a path other than /api/v1/health"),
    ("ftp://127.0.0.1:9955", "expected http://HOST:PORT or https://HOST:PORT"),
    ("node:9955", "expected http://HOST:PORT or https://HOST:PORT"),
    ("http://:9955", "no host"),
    ("http://127.0.0.1:99999", "port"),
    ("http://npd:secret@127.0.0.1:9955", "--auth.username"),
    ("http://127.0.0.1:9955/?x=1", "query"),
])
def test_a_url_health_cannot_use_is_one_line_and_unknown(capsys, url, says):
    assert main(["health", "--url", url]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("cluster-telemetry-exporter: health: --url")
    assert says in err, err
    assert out.startswith("unknown: ") and "secret" not in out + err


def test_url_and_listen_address_are_one_or_the_other(capsys):
    assert main(["health", "--url", "http://127.0.0.1:9955",
                 "--web.listen-address", "127.0.0.1:9955"]) == 2
    assert "give one of --url and --web.listen-address" in capsys.readouterr().err


def test_a_url_without_a_port_asks_the_default_port(capsys):
    from exporter.commands.health.command import url_address

    assert url_address("http://gpu-a17") == ("http", "gpu-a17:9955")
    assert url_address("https://[fd00::7]:9100/") == ("https", "[fd00::7]:9100")


def test_the_url_scheme_must_agree_with_the_web_config(tmp_path, capsys):
    certs = make_certs(tmp_path / "certs")
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {certs.server_cert}\n"
                   f"  key_file: {certs.server_key}\n")
    factory = ExporterFactory()
    try:
        exporter = factory.start(manual=True, web_config_file=str(web))
        exporter.sampler.advance(16)
        flags = ("--web.config.file", str(web))
        code, out = health(capsys, None, "--url", f"https://127.0.0.1:{exporter.port}", *flags)
        assert code == 0 and out.startswith("ok: "), out
        code, out = health(capsys, None, "--url", f"http://127.0.0.1:{exporter.port}", *flags)
        assert code == 2 and "serves TLS" in out and "https://" in out
        # https without the web config: the system's trust store, which does not know the
        # test's CA: no verdict
        code, out = health(capsys, None, "--url", f"https://127.0.0.1:{exporter.port}")
        assert code == 2 and "CERTIFICATE_VERIFY_FAILED" in out
    finally:
        factory.stop_all()
