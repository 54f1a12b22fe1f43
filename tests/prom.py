"""Run a real Prometheus (Debian package) on loopback for end-to-end tests."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from tests.tools import free_port, require_binary


class Prometheus:
    """A throwaway Prometheus scraping the given targets; stop() always kills it."""

    def __init__(self, workdir: Path, targets: list[str], scrape_interval: str = "1s",
                 rule_files: list[str] | None = None, evaluation_interval: str = "1s",
                 scrape_configs: list[dict] | None = None):
        """scrape_configs, when given, replace the one plain job over targets."""
        binary = require_binary("prometheus")
        self.port = free_port()
        config = {
            "global": {"scrape_interval": scrape_interval,
                       "evaluation_interval": evaluation_interval},
            "scrape_configs": scrape_configs or [
                {"job_name": "gpu", "static_configs": [{"targets": targets}]}],
        }
        if rule_files:
            config["rule_files"] = rule_files
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [binary, f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: see {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("prometheus did not become ready")

    def api(self, path: str, **params: str) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self.log.close()
