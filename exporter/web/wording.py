"""How findings are written: one dict per finding, sentences a person on call reads.

Shared by exporter/web/findings.py (power, stragglers, stalls) and
exporter/web/findings_hardware.py (XIDs, memory, NVLink, lost GPUs, clock events).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

CRITICAL, WARNING, INFO = "critical", "warning", "info"
SEVERITIES = (CRITICAL, WARNING, INFO)
# The one severity vocabulary, from a health state (exporter/health/model.py): what the
# verdict failed is critical, what it warns of a warning, anything else information.
_STATE_SEVERITY = {"failed": CRITICAL, "warning": WARNING}


def severity_of(state: str) -> str:
    return _STATE_SEVERITY.get(state, INFO)


def finding(kind: str, severity: str, message: str, time: float, *, gpu: int | None = None,
            since: float | None = None, **details: Any) -> dict[str, Any]:
    """One finding: the same keys for every kind, so a client needs no per-kind code to
    list them; `details` holds the kind's own figures (JSON-ready)."""
    return {"kind": kind, "severity": severity, "gpu": gpu, "time": number(time, 3),
            "since": number(since, 3), "message": message, "details": details}


def number(value: float | None, decimals: int = 3) -> float | None:
    """A JSON-ready number: rounded, None for missing, NaN or infinite."""
    if value is None or not math.isfinite(value):
        return None
    return round(float(value), decimals)


def duration(seconds: float) -> str:
    """'45 s', '6 min', '2 h 5 min', '3 d 4 h': the precision a person wants."""
    s = max(0.0, seconds)
    if s < 90:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 86400:
        h, m = divmod(int(s // 60), 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(int(s // 3600), 24)
    return f"{d} d {h} h" if h else f"{d} d"


def ago(now: float, then: float) -> str:
    return "just now" if now - then < 1.5 else f"{duration(now - then)} ago"


def watts(value: float) -> str:
    return f"{value:,.0f} W"


def percent(ratio: float) -> str:
    return f"{ratio * 100:.0f} %"


def gpu_list(gpus: Iterable[int]) -> str:
    """'GPU 3', 'GPUs 0-2, 5': runs of consecutive indices folded."""
    ids = sorted(set(gpus))
    runs: list[list[int]] = []
    for g in ids:
        if runs and g == runs[-1][-1] + 1:
            runs[-1].append(g)
        else:
            runs.append([g])
    text = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r))
                     for r in runs)
    return f"GPU {text}" if len(ids) == 1 else f"GPUs {text}"
