"""The landing page in a real browser (headless Chromium): status and links render."""

from __future__ import annotations

import re
import subprocess

from exporter.app import Exporter
from exporter.config import Config
from tests.tools import require_binary


def test_landing_page_in_headless_chromium(tmp_path):
    chromium = require_binary("chromium")
    exp = Exporter(Config.of(listen_address="127.0.0.1:0", fake=True, collector_host=False,
                          collector_infiniband=False))
    exp.start()
    try:
        result = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
             f"http://127.0.0.1:{exp.port}/"],
            capture_output=True, text=True, timeout=90)
    finally:
        exp.stop()
    dom = result.stdout
    assert result.returncode == 0, result.stderr[-2000:]
    # ready, or degraded with the reason when a cold browser start starves this 2-core box
    assert re.search(r'<span id="readiness"[^>]*>ready(, degraded: [^<]+)?</span>', dom), (
        dom + result.stderr[-2000:])
    # the GPUs' verdict apart: before the GPUs are identified it cannot say yet
    verdict = r'<span id="verdict"[^>]*>(ok \(8 GPUs\)|unknown: GPUs 0-7|no verdict yet)</span>'
    assert re.search(verdict, dom), dom
    assert re.search(r'<span id="gpus">8</span>', dom), dom
    for path in ("/metrics", "/healthz", "/readyz"):
        assert f'href="{path}"' in dom, path
