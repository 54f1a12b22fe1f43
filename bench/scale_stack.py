"""Run the sharded deployment of deploy/scale on loopback, from its own files.

Used by bench/fleet_scale.py and by tests/test_e2e_scale.py (which is how the unit files
are tested for real).

Each component runs the ExecStart line of its unit file, under the unit's own hardening as
far as it applies without systemd (bench/unit_sandbox.py), with the settings of scale.env
overridden where a test needs its own (ports picked free, a temporary directory, short
intervals); the scrape config is deploy/scale/scrape.yml with the caller's interval and
targets. Alertmanager (Debian's prometheus-alertmanager) runs with an empty route.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from bench.unit_sandbox import sandboxed

REPO = Path(__file__).resolve().parent.parent
SCALE = REPO / "deploy" / "scale"
# The Debian packages' binaries the deployment runs.
BINARIES = ("victoria-metrics", "vmagent", "vmalert", "prometheus-alertmanager")


def binary(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise FileNotFoundError(f"{name} is not installed (Debian: victoria-metrics, "
                                "prometheus-alertmanager)")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def read_env(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of an EnvironmentFile (comments and blank lines skipped)."""
    env = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
            raise ValueError(f"{path.name}:{number}: not KEY=VALUE: {line!r}")
        env[key] = value
    return env


def hardened_start(unit: Path, env: dict[str, str], instance: str = "") -> list[str]:
    """exec_start run under the unit's hardening; its state directory is ${DATA_DIR}."""
    return sandboxed(unit, exec_start(unit, env, instance), Path(env["DATA_DIR"]))


def exec_start(unit: Path, env: dict[str, str], instance: str = "") -> list[str]:
    """The unit's ExecStart, its ${VAR}s from env and %i the instance; the binary from PATH."""
    lines, joined = unit.read_text().splitlines(), ""
    for i, line in enumerate(lines):
        if line.startswith("ExecStart="):
            joined = line.removeprefix("ExecStart=")
            while joined.endswith("\\"):
                i += 1
                joined = joined[:-1] + " " + lines[i].strip()
            break
    if not joined:
        raise ValueError(f"{unit.name}: no ExecStart")

    def value(m: re.Match) -> str:
        if m.group(1) not in env:
            raise KeyError(f"{unit.name}: ${{{m.group(1)}}} is not set")
        return env[m.group(1)]

    args = [re.sub(r"\$\{(\w+)\}", value, arg).replace("%i", instance)
            for arg in shlex.split(joined)]
    return [binary(Path(args[0]).name), *args[1:]]


def get_json(url: str, timeout: float = 10) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


def query(base: str, expr: str, **params) -> list[dict]:
    """An instant query (Prometheus API) at base; extra params such as extra_filters[]."""
    args = urllib.parse.urlencode({"query": expr, **params}, doseq=True)
    body = get_json(f"{base}/api/v1/query?{args}")
    assert body["status"] == "success", body
    return body["data"]["result"]


class ScaleStack:
    """VictoriaMetrics, `shards` vmagents, the node-local and the global vmalert and an
    Alertmanager, all on 127.0.0.1; stop() ends every process it started."""

    def __init__(self, workdir: Path, targets: list[str], labels: dict[str, str],
                 rules_dir: Path, shards: int = 2, replication: int = 1,
                 scrape_interval: str = "15s", evaluation_interval: str = "15s",
                 latency_offset: str | None = "1s"):
        """latency_offset None keeps scale.env's (how long a sample waits before queries
        see it); tests shorten it so the rules see fresh samples."""
        self.workdir, self.procs = workdir, []
        self.pids: dict[str, int] = {}
        ports = {name: free_port() for name in ("vm", "node", "global", "am")}
        self.vmagent_ports = [free_port() for _ in range(shards)]
        self.vm = f"http://127.0.0.1:{ports['vm']}"
        self.vmalert_node = f"http://127.0.0.1:{ports['node']}"
        self.vmalert_global = f"http://127.0.0.1:{ports['global']}"
        self.alertmanager = f"http://127.0.0.1:{ports['am']}"
        config = workdir / "scale"
        (config / "targets").mkdir(parents=True)
        scrape = yaml.safe_load((SCALE / "scrape.yml").read_text())
        scrape["global"]["scrape_interval"] = scrape_interval
        scrape["global"]["scrape_timeout"] = scrape_interval
        (config / "scrape.yml").write_text(yaml.safe_dump(scrape))
        (config / "targets" / "gpu-nodes.yml").write_text(
            yaml.safe_dump([{"labels": labels, "targets": targets}]))
        self.env = read_env(SCALE / "scale.env") | {
            "CONFIG_DIR": str(config), "RULES_DIR": str(rules_dir),
            "DATA_DIR": str(workdir / "data"), "SHARDS": str(shards),
            "REPLICATION": str(replication), "SCRAPE_INTERVAL": scrape_interval,
            "EVALUATION_INTERVAL": evaluation_interval,
            "VM_LISTEN": f"127.0.0.1:{ports['vm']}", "VM_URL": self.vm,
            "VMALERT_NODE_LISTEN": f"127.0.0.1:{ports['node']}",
            "VMALERT_GLOBAL_LISTEN": f"127.0.0.1:{ports['global']}",
            "ALERTMANAGER_URL": self.alertmanager}
        if latency_offset is not None:
            self.env["LATENCY_OFFSET"] = latency_offset
        try:
            self._alertmanager(ports["am"])
            self._start("victoria-metrics", hardened_start(SCALE / "victoria-metrics.service",
                                                           self.env), self.vm)
            for shard, port in enumerate(self.vmagent_ports):
                env = self.env | {"VMAGENT_LISTEN": f"127.0.0.1:{port}"}
                self._start(f"vmagent-{shard}", hardened_start(SCALE / "vmagent@.service", env,
                                                               str(shard)),
                            f"http://127.0.0.1:{port}")
            self._start("vmalert-node", hardened_start(SCALE / "vmalert-node.service",
                                                       self.env), self.vmalert_node)
            self._start("vmalert-global", hardened_start(SCALE / "vmalert-global.service",
                                                         self.env), self.vmalert_global)
        except BaseException:
            self.stop()
            raise

    def _alertmanager(self, port: int) -> None:
        config = self.workdir / "alertmanager.yml"
        config.write_text(yaml.safe_dump({"route": {"receiver": "none"},
                                          "receivers": [{"name": "none"}]}))
        self._start("alertmanager", [
            binary("prometheus-alertmanager"), f"--config.file={config}",
            f"--storage.path={self.workdir / 'am'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
            self.alertmanager, ready="/-/ready")

    def _start(self, name: str, argv: list[str], base: str, ready: str = "/health") -> None:
        log = (self.workdir / f"{name}.log").open("w")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((name, proc, log))
        self.pids[name] = proc.pid
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited: {(self.workdir / f'{name}.log').read_text()}")
            try:
                with urllib.request.urlopen(base + ready, timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{name} did not become ready")

    def shard_targets(self) -> list[set[str]]:
        """The targets each vmagent scrapes (its active targets)."""
        out = []
        for port in self.vmagent_ports:
            body = get_json(f"http://127.0.0.1:{port}/api/v1/targets")
            out.append({t["labels"]["instance"] for t in body["data"]["activeTargets"]})
        return out

    def vmalert_alerts(self, base: str) -> list[dict]:
        return get_json(f"{base}/api/v1/alerts")["data"]["alerts"] or []

    def rules(self, base: str) -> list[dict]:
        """Every rule a vmalert has loaded, with its group's name under "group"."""
        return [rule | {"group": group["name"]}
                for group in get_json(f"{base}/api/v1/rules")["data"]["groups"]
                for rule in group["rules"]]

    def rule_errors(self, base: str) -> dict[str, str]:
        """{group/rule: its last evaluation error} for every rule of a vmalert that failed."""
        return {f"{r['group']}/{r['name']}": r["lastError"] for r in self.rules(base)
                if r.get("lastError")}

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text()

    def stop(self) -> None:
        """One at a time, the last started first: the rulers and shards flush into a store
        that is still there."""
        for _, proc, log in reversed(self.procs):
            stop_process(proc)
            log.close()
        self.procs = []


def copy_rules(target: Path, edit=None) -> Path:
    """alerts/*.yml copied to target (edit(name, text) -> text changes a copy)."""
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted((REPO / "alerts").glob("*.yml")):
        text = path.read_text()
        (target / path.name).write_text(edit(path.name, text) if edit else text)
    return target
