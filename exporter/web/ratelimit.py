"""exporter-toolkit's rate_limit: a token bucket over every request (Go's x/time/rate).

    rate_limit:
      interval: 100ms   # one token every interval (0: no limit)
      burst: 10         # the bucket holds this many (0: every request is refused, as in Go)

A request that finds the bucket empty gets 429 before any other work (basic auth
included), as exporter-toolkit answers it. /healthz and /readyz are not counted: a
kubelet probe refused for want of a token would restart a healthy exporter.
"""

from __future__ import annotations

import re
import threading
import time

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
          "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration ("1s", "1m30s", "250ms", "0"); ValueError if not one."""
    if text == "0":
        return 0.0
    total, pos = 0.0, 0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"{text!r} is not a duration like 1s, 250ms or 1m30s")
    return total


class TokenBucket:
    def __init__(self, interval_seconds: float, burst: int) -> None:
        self.interval = interval_seconds
        self.burst = burst
        self._tokens = float(burst)  # starts full, as Go's limiter
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self.refused = 0

    def allow(self) -> bool:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) / self.interval)
            self._last = now
            if self._tokens >= 1:
                self._tokens -= 1
                return True
            self.refused += 1
            return False
