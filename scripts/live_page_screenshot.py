"""Screenshot the live page as tests/test_live_page.py sees it (docs/img/live-page.png).

    PYTHONPATH=. python scripts/live_page_screenshot.py [OUT.png] [--wait 60] [--url-suffix S]

Starts an exporter on the fake straggler node (persistence 5 s, as `run --fake --scenario
straggler --straggler.persistence 5`), waits, and has headless Chromium (Debian's
`chromium`) take a 1280x900 screenshot of `/`. `--url-suffix '#gpu=5'` opens it with
GPU 5 in focus.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time

from exporter.app import Exporter
from exporter.config import Config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", nargs="?", default="docs/img/live-page.png")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds of data first")
    parser.add_argument("--url-suffix", default="")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        print("live_page_screenshot: chromium not found (Debian: apt install chromium)",
              file=sys.stderr)
        return 2
    exp = Exporter(Config.of(listen_address="127.0.0.1:0", fake=True, scenario="straggler",
                          straggler_persistence_seconds=5.0, collector_host=False,
                          collector_infiniband=False))
    exp.start()
    try:
        time.sleep(args.wait)
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run(
                [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", f"--user-data-dir={profile}", "--window-size=1280,900",
                 "--virtual-time-budget=4000", f"--screenshot={args.out}",
                 f"http://127.0.0.1:{exp.port}/{args.url_suffix}"],
                check=True, capture_output=True, timeout=120)
    finally:
        exp.stop()
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
