"""The live page at `/`: the node's power waveform, what the exporter concludes, the node.

The HTML is a shell written here with the status known now (so it says something useful
without JavaScript: GPU count, backend, health, the links); exporter/web/static/page.js
fills it from /api/v1/power, /api/v1/findings and /api/v1/health about once a second,
drawing with the vendored uPlot. Every request the page makes goes to this exporter (same
origin, so the browser resends basic-auth credentials and TLS covers it); PAGE_HEADERS' content
security policy makes the browser refuse anything else.
"""

from __future__ import annotations

import html

from exporter import __version__
from exporter.health.model import unknown_health
from exporter.metrics.render import RenderedSnapshot
from exporter.web.api import verdict_summary
from exporter.web.static import url

# Same origin only: scripts, styles, fetches; no frames, no forms, no plugins.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}
WINDOWS = (30, 60, 120)  # seconds the page can show; 60 at first


def page_for(rendered: RenderedSnapshot | None, readiness: str, node: str) -> bytes:
    """The page for the snapshot being served (None: none yet) and the exporter's
    readiness words."""
    backend = "starting"
    gpus = 0
    if rendered is not None:
        snap = rendered.snapshot
        backend = snap.backend + (f" (scenario {snap.scenario})" if snap.backend == "fake" else "")
        gpus = snap.gpu_count
    verdict = verdict_summary(rendered.verdict if rendered is not None
                              else unknown_health(0.0, 0))
    return landing_page(gpus, backend, readiness, verdict, node)


def headers_beside(configured: dict[str, str]) -> dict[str, str]:
    """The page's own headers, except where the web config sets one (its CSP wins)."""
    return {k: v for k, v in PAGE_HEADERS.items() if k not in configured}


def landing_page(gpus: int, backend: str, readiness: str, verdict: str, node: str) -> bytes:
    """`readiness`: the exporter's own (/readyz); `verdict`: the GPUs' (/api/v1/health's
    summary). Two things a reader must never confuse: an exporter that serves well beside
    a failed GPU is ready."""
    e = html.escape
    windows = "".join(f'<option value="{s}"{" selected" if s == 60 else ""}>{s} s</option>'
                      for s in WINDOWS)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{e(node)}: cluster-telemetry-exporter</title>
<link rel="stylesheet" href="{url('uPlot.min.css')}">
<link rel="stylesheet" href="{url('page.css')}">
</head>
<body>
<header>
<h1>cluster-telemetry-exporter {e(__version__)} <span class="node" id="node">{e(node)}</span></h1>
<p class="status">GPUs: <span id="gpus">{gpus}</span> &middot;
backend: <span id="backend">{e(backend)}</span> &middot;
exporter: <span id="readiness">{e(readiness)}</span> &middot;
GPU verdict: <span id="verdict">{e(verdict)}</span>
<span id="conn" class="conn"></span></p>
<nav><ul><li><a href="/metrics">/metrics</a></li><li><a href="/healthz">/healthz</a></li>
<li><a href="/readyz">/readyz</a></li><li><a href="/api/v1/findings">/api/v1/findings</a></li>
<li><a href="/api/v1/health">/api/v1/health</a></li>
</ul></nav>
</header>
<main>
<section class="charts" aria-label="power">
<div class="bar"><h2>Node power</h2>
<label>window <select id="window">{windows}</select></label>
<span id="rate" class="muted"></span></div>
<div id="node-chart" class="chart"></div>
<div class="bar"><h2>GPU power</h2>
<button type="button" id="all">all</button><button type="button" id="none">none</button>
</div>
<div id="gpu-chart" class="chart"></div>
<table id="gpu-table"><thead><tr><th></th><th>GPU</th><th>model</th><th>job</th>
<th class="num">power</th><th>state</th></tr></thead><tbody></tbody></table>
</section>
<aside>
<h2>Health <span id="health-verdict" class="verdict"></span></h2>
<ul id="health-list"><li class="muted">waiting for the first answer&hellip;</li></ul>
<h2>Findings <span id="findings-count" class="muted"></span></h2>
<ul id="findings"><li class="muted">waiting for the first answer&hellip;</li></ul>
<h2>Node</h2>
<dl id="summary"></dl>
</aside>
</main>
<noscript><p>The live charts need JavaScript; the links above work without it.</p></noscript>
<script src="{url('uPlot.iife.min.js')}"></script>
<script src="{url('page.js')}"></script>
</body></html>
""".encode()
