"""The JSON API the live page polls: /api/v1/power and /api/v1/findings; and
/api/v1/history, the node's stored episodes (from the state directory, not the snapshot).

Answers come from the snapshot being served, never from NVML: power from the ring
buffer's windows (copies taken under its short lock), findings from
exporter/web/findings.py. Each answer is built once per snapshot and query and kept with
its gzip until the next snapshot, so any number of open pages costs one build a second.
What one request can cost is bounded: a short query string with known parameters only,
whole seconds up to the buffer's length, at most MAX_POINTS_PER_SERIES points a series,
a bounded number of answers kept, and one build at a time.
"""

from __future__ import annotations

import gzip
import json
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

import numpy as np

from exporter import __version__
from exporter.analysis.goodput import STATES, goodput_ratio
from exporter.analysis.signal import median
from exporter.health.model import (
    FAILED,
    NONE,
    NOT_JUDGED,
    UNKNOWN,
    WARNING,
    CheckResult,
    NodeHealth,
    Verdict,
    action_words,
)
from exporter.health.monitor import Published
from exporter.history.answer import DEFAULT_PAGE, MAX_PAGE, history_body, replacement_findings
from exporter.history.recorder import History
from exporter.metrics.render import RenderedSnapshot
from exporter.sampling.collector_api import JobHolders
from exporter.sampling.snapshot import Snapshot
from exporter.web.findings import findings
from exporter.web.jsonarrays import json_array
from exporter.web.probes import Readiness
from exporter.web.wording import gpu_list, number

log = logging.getLogger(__name__)

POWER, FINDINGS, HEALTH, HISTORY = ("/api/v1/power", "/api/v1/findings", "/api/v1/health",
                                   "/api/v1/history")
PATHS = (POWER, FINDINGS, HEALTH, HISTORY)
JSON_TYPE = "application/json"
DEFAULT_SECONDS = 60
# 120 s at 50 samples a second (the page's longest window) goes out undecimated; longer
# windows keep each bucket's lowest and highest sample, so peaks and dips still show.
MAX_POINTS_PER_SERIES = 6000
TIME_DECIMALS = 3  # ms: samples are ~20 ms apart
WATT_DECIMALS = 1  # 0.1 W, well inside the sensor's +-5 W
MAX_QUERY_BYTES = 64
MAX_HISTORY_QUERY_BYTES = 320  # a GPU's UUID, two times and a page, percent-encoded
MAX_ANSWERS_KEPT = 16  # per snapshot: distinct queries beyond this are built, not kept


class BadRequest(ValueError):
    """A query the API refuses; the message is the one line the client gets."""


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode() + b"\n"


def parse_query(query: str, allowed: tuple[str, ...], limit: int = MAX_QUERY_BYTES,
                decode: bool = False) -> dict[str, str]:
    """name -> value for a query of known, unrepeated parameters, or BadRequest. `decode`:
    percent-decoded, `+` a space (the history's UUIDs and cursors; the other answers take
    plain digits only)."""
    if len(query) > limit:
        raise BadRequest("query string too long")
    out: dict[str, str] = {}
    for field in query.split("&") if query else ():
        name, _, value = (unquote_plus(p) if decode else p for p in field.partition("="))
        if name not in allowed:
            shown = name[:32].encode("ascii", "replace").decode()
            raise BadRequest(f"unknown parameter {shown!r}; allowed: {', '.join(allowed)}"
                             if allowed else f"unknown parameter {shown!r}; none allowed")
        if name in out:
            raise BadRequest(f"parameter {name!r} given twice")
        out[name] = value
    return out


@dataclass(frozen=True)
class PowerQuery:
    seconds: int
    gpu: int | None  # None: every GPU


def ring_seconds(snapshot: Snapshot) -> int:
    """The longest window /api/v1/power serves: what the power ring is sized for."""
    ring = snapshot.power_ring
    return max(1, int(ring.span_seconds if ring is not None else 0) or 660)


def power_query(query: str, snapshot: Snapshot) -> PowerQuery:
    params = parse_query(query, ("seconds", "gpu"))
    longest = ring_seconds(snapshot)
    raw = params.get("seconds", str(DEFAULT_SECONDS))
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6 and 1 <= int(raw) <= longest):
        raise BadRequest(f"seconds must be a whole number from 1 to {longest}")
    gpu = params.get("gpu")
    if gpu is not None and not (gpu.isascii() and gpu.isdigit() and len(gpu) <= 4
                                and int(gpu) < snapshot.gpu_count):
        raise BadRequest(f"gpu must be a GPU index from 0 to {snapshot.gpu_count - 1}")
    return PowerQuery(int(raw), None if gpu is None else int(gpu))


# -- /api/v1/power ---------------------------------------------------------------------------

def power_body(snapshot: Snapshot, query: PowerQuery) -> bytes:
    """{"gpus": {"0": series, ...}, "node": series, "sample_interval_seconds",
    "observable_band_hz", ...}; series = {"timestamps", "watts", "decimated"}."""
    ring = snapshot.power_ring
    interval = _interval(snapshot)
    gpus = range(snapshot.gpu_count) if query.gpu is None else (query.gpu,)
    parts = []
    for gpu in gpus:
        if ring is None:
            times, watts = np.zeros(0), np.zeros(0)
        else:
            times, watts = ring.window(gpu, query.seconds)
        parts.append(b'"%d":' % gpu + _series(times, watts))
    if ring is not None and ring.end is not None and interval:
        grid, per_gpu = ring.grid(query.seconds, interval)
        node = _node_sum(per_gpu)
    else:
        grid, node = np.zeros(0), np.zeros(0)
    head = {"time": number(snapshot.time), "seconds": query.seconds,
            "sample_interval_seconds": number(interval, 6),
            "observable_band_hz": [number(f, 4) for f in snapshot.observable_band_hz],
            "max_points_per_series": MAX_POINTS_PER_SERIES}
    return b"".join([json.dumps(head)[:-1].encode(), b', "gpus": {', b",".join(parts),
                     b'}, "node": ', _series(grid, node), b"}\n"])


def _interval(snapshot: Snapshot) -> float | None:
    """The node's native interval: the median of its GPUs' sample intervals."""
    values = [s.sample_interval_seconds for s in snapshot.power_sampling.values()
              if s.sample_interval_seconds]
    return max(float(median(values)), 0.001) if values else None


def _node_sum(per_gpu: np.ndarray) -> np.ndarray:
    """The GPUs summed at each grid point; a GPU without data there (lost, a gap) is left
    out of the sum rather than blanking the node; NaN where no GPU has data."""
    have = np.isfinite(per_gpu)
    total = np.where(have, per_gpu, 0.0).sum(axis=0)
    return np.where(have.any(axis=0), total, np.nan)


def _series(times: np.ndarray, watts: np.ndarray) -> bytes:
    times, watts, decimated = decimate(times, watts, MAX_POINTS_PER_SERIES)
    return b"".join([b'{"timestamps": ', json_array(times, TIME_DECIMALS), b', "watts": ',
                     json_array(watts, WATT_DECIMALS), b', "decimated": ',
                     b"true" if decimated else b"false", b"}"])


def decimate(times: np.ndarray, watts: np.ndarray, cap: int
             ) -> tuple[np.ndarray, np.ndarray, bool]:
    """At most `cap` points: each of cap/2 buckets keeps its lowest and highest sample, in
    time order (a stride would drop the dips a person looks for)."""
    n = len(times)
    if n <= cap:
        return times, watts, False
    per = -(-n // (cap // 2))
    buckets = -(-n // per)
    padded = np.concatenate([watts, np.full(buckets * per - n, np.nan)]).reshape(buckets, per)
    missing = np.isnan(padded)
    lo = np.argmin(np.where(missing, np.inf, padded), axis=1)
    hi = np.argmax(np.where(missing, -np.inf, padded), axis=1)
    base = np.arange(buckets) * per
    keep = np.sort(np.concatenate([base + lo, base + hi]))
    # each index once (np.unique would load numpy.ma, ~1 MiB, when a page is open)
    keep = keep[np.concatenate(([True], keep[1:] != keep[:-1]))]
    keep = keep[keep < n]
    return times[keep], watts[keep], True


# -- /api/v1/findings ------------------------------------------------------------------------

def findings_body(published: Published, readiness: Readiness, node: str,
                  history: History | None = None) -> bytes:
    """{"time", "findings": [...], "summary": {...}}: what the exporter concludes, and the
    node at a glance (GPUs up, who holds them, the exporter's own readiness)."""
    snapshot = published.snapshot
    found = findings(published)
    if history is not None:
        found += replacement_findings(history, snapshot.time)
    body = {"time": number(snapshot.time), "findings": found,
            "summary": summary(snapshot, readiness, node)}
    return json.dumps(body, ensure_ascii=False).encode() + b"\n"


def summary(snapshot: Snapshot, readiness: Readiness, node: str) -> dict[str, Any]:
    jobs = _jobs(snapshot)
    gpus = []
    for gpu in range(snapshot.gpu_count):
        ident = snapshot.identities[gpu] if gpu < len(snapshot.identities) else None
        reading = snapshot.power.get(gpu)
        gpus.append({"gpu": gpu, "name": ident.name if ident else None,
                     "uuid": ident.uuid if ident else None, "up": snapshot.up(gpu),
                     "lost": gpu in snapshot.lost, "hung": gpu in snapshot.hung,
                     "jobs": list(jobs.get(gpu, ())),
                     "watts": number(reading.watts, 1) if reading else None})
    return {"node": node, "version": __version__, "backend": snapshot.backend,
            "scenario": snapshot.scenario, "started_at": number(snapshot.started_at),
            "gpu_count": snapshot.gpu_count, "expected_gpus": snapshot.expected_gpus,
            "gpus_up": sum(g["up"] for g in gpus),
            "readiness": {"status": readiness.status, "words": readiness.words,
                          "problems": list(readiness.problems)},
            "sample_interval_seconds": number(_interval(snapshot), 6),
            "observable_band_hz": [number(f, 4) for f in snapshot.observable_band_hz],
            "step": _step(snapshot), "goodput": _goodput(snapshot), "gpus": gpus}


def _goodput(snapshot: Snapshot) -> dict[str, Any] | None:
    """The node's goodput account since the exporter started (analysis.goodput): the
    ratio of productive to held time and the GPU-seconds in each state."""
    account = snapshot.goodput
    if account is None:
        return None
    seconds = account.seconds.sum(axis=0)
    ratio = goodput_ratio(seconds)
    return {"ratio": None if ratio is None else number(ratio, 4),
            "gpu_seconds": {state: number(float(v), 1)
                            for state, v in zip(STATES, seconds, strict=True)},
            "pending_gpu_seconds": number(float(account.pending.sum()), 1),
            # an estimate: the productive time since the last checkpoint before each
            # failure, never subtracted from productive (docs/goodput.md)
            "lost_progress_estimate": {"failures": account.failures,
                                       "gpu_seconds": number(account.lost_progress_gpu_seconds,
                                                             1)},
            # each job's checkpoints in a line, by job ("node": no job mapping)
            "checkpoints": dict(account.checkpoints)}


def _step(snapshot: Snapshot) -> dict[str, Any] | None:
    """The step period read from the node's power (analysis.step_segments), or None while
    no clear step swing shows in its compute plateaus."""
    analysis = snapshot.power_analysis
    swing = analysis.step_swing if analysis is not None else None
    if analysis is None or swing is None:
        return None
    return {"period_seconds": number(swing.period_seconds, 6),
            "frequency_hz": number(swing.frequency_hz, 6),
            "confidence": number(swing.confidence, 6),
            "amplitude_watts": number(swing.amplitude_watts, 1),
            "synchrony": number(swing.synchrony), "duty": number(swing.duty),
            "grid_relevant": bool(analysis.step_grid_relevant)}


def _jobs(snapshot: Snapshot) -> dict[int, tuple[str, ...]]:
    """GPU -> the jobs (or pods) holding it, from any collector whose reading maps them
    (`JobHolders`: the jobs collector's reading)."""
    out: dict[int, tuple[str, ...]] = {}
    for result in snapshot.collectors.values():
        if isinstance(result.reading, JobHolders):
            for gpu, ids in result.reading.jobs_by_gpu().items():
                out[int(gpu)] = out.get(int(gpu), ()) + tuple(str(i) for i in ids)
    return out


# -- /api/v1/health --------------------------------------------------------------------------

def health_body(health: NodeHealth) -> bytes:
    """{"summary", "node": verdict, "gpus": {"0": verdict, ...}}; verdict = {"state",
    "action", "action_words", "reasons", "checks": [{"name", "state", "value",
    "threshold", "source", "since", "action", "action_words", "reason"}]}, a check judged
    per InfiniBand port also {"device", "port"}. Before the first judgement the verdict is
    an explicit unknown one (model.unknown_health)."""
    body = {"summary": verdict_summary(health), "node": _verdict(health.node),
            "gpus": {str(gpu): _verdict(v) for gpu, v in sorted(health.gpus.items())}}
    return json.dumps(body, ensure_ascii=False).encode() + b"\n"


def verdict_summary(health: NodeHealth) -> str:
    """The GPUs' verdict in one line, as the page's header shows it: "ok (8 GPUs)",
    "failed: GPU 2 (reset the GPU); warning: GPU 5", "unknown (not judged yet)"."""
    node = health.node
    if not node.checks and node.state == UNKNOWN:  # nothing judged: say why
        return f"{UNKNOWN} ({node.reasons or NOT_JUDGED})"
    parts = []
    for state in (FAILED, WARNING, UNKNOWN):
        gpus = [(g, v) for g, v in sorted(health.gpus.items()) if v.state == state]
        if not gpus:
            continue
        actions = list(dict.fromkeys(v.action for _, v in gpus if v.action != NONE))
        said = f" ({', '.join(action_words(a) for a in actions)})" if actions else ""
        parts.append(f"{state}: {gpu_list(g for g, _ in gpus)}{said}")
    if node.state in (FAILED, WARNING) and not parts:
        parts.append(f"{node.state}: the node ({node.reasons})")
    return "; ".join(parts) if parts else f"{node.state} ({len(health.gpus)} GPUs)"


def _verdict(v: Verdict) -> dict[str, Any]:
    return {"state": v.state, "action": v.action, "action_words": action_words(v.action),
            "reasons": v.reasons, "checks": [_check(c) for c in v.checks]}


def _check(c: CheckResult) -> dict[str, Any]:
    said = {"name": c.name, "state": c.state, "value": _json_value(c.value),
            "threshold": _json_value(c.threshold), "source": c.source,
            "since": number(c.since), "action": c.action,
            "action_words": action_words(c.action), "reason": c.reason}
    if c.port:
        # a check judged per InfiniBand port: which one, as gpu_node_health_check_state's
        # `device` and `port` labels say it (the same name repeats once per port)
        said["device"], _, said["port"] = c.port.rpartition("/")
    return said


def _json_value(value: float | str | None) -> float | str | None:
    if isinstance(value, float):
        whole = value.is_integer() and abs(value) < 2**53
        return int(value) if whole else number(value, 6)
    return value


# -- answers, once per snapshot ------------------------------------------------------------------

class Answer:
    """One JSON answer and, when first asked for, its gzip."""

    def __init__(self, body: bytes):
        self.body = body
        self._gzipped: bytes | None = None
        self._lock = threading.Lock()

    @property
    def gzipped(self) -> bytes:
        with self._lock:
            if self._gzipped is None:
                self._gzipped = gzip.compress(self.body, compresslevel=1, mtime=0)
            return self._gzipped


def _seconds(params: dict[str, str], name: str) -> float | None:
    text = params.get(name)
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise BadRequest(f"{name}: expected unix seconds, got {text[:32]!r}") from None
    if not np.isfinite(value) or value < 0:
        raise BadRequest(f"{name}: expected unix seconds, got {text[:32]!r}")
    return value


def _page_size(text: str | None) -> int:
    if text is None or text == "":
        return DEFAULT_PAGE
    if not (text.isascii() and text.isdigit() and len(text) <= 6
            and 1 <= int(text) <= MAX_PAGE):
        raise BadRequest(f"limit must be a whole number from 1 to {MAX_PAGE}")
    return int(text)


class Api:
    """Builds and keeps the answers for the snapshot being served."""

    def __init__(self, readiness: Callable[[RenderedSnapshot], Readiness],
                 node: str | None = None, history: History | None = None):
        """`history`: the app's, where a state directory is kept."""
        self.readiness = readiness
        self.node = node or socket.gethostname()
        self._lock = threading.Lock()
        self._for: RenderedSnapshot | None = None
        self._answers: dict[tuple, Answer] = {}
        self.history = history

    def reply(self, rendered: RenderedSnapshot | None, path: str, query: str,
              gzip_ok: bool) -> tuple[int, bytes, dict[str, str]]:
        """Status, body and headers for GET path?query (path one of PATHS): 503 before
        the first snapshot, 400 for a query refused, 500 and a log line for a bug."""
        no_store = {"Cache-Control": "no-store"}
        if rendered is None:
            return 503, error_body("no snapshot yet"), no_store
        try:
            answer = self.answer(rendered, path, query)
        except BadRequest as exc:
            return 400, error_body(str(exc)), no_store
        except Exception:  # a bug of ours: one answer and one log line, never a dropped
            # connection; the exporter serves on
            log.exception("%s failed", path)
            return 500, error_body("internal error (the exporter's log says what)"), no_store
        headers = {**no_store, "Vary": "Accept-Encoding"}
        if gzip_ok:
            return 200, answer.gzipped, {**headers, "Content-Encoding": "gzip"}
        return 200, answer.body, headers

    def answer(self, rendered: RenderedSnapshot, path: str, query: str) -> Answer:
        """The answer to GET path?query; BadRequest for a query it refuses."""
        snap = rendered.snapshot
        build: Callable[[], bytes]
        key: tuple
        if path == HISTORY:
            params = parse_query(query, ("gpu", "since", "until", "limit", "after"),
                                 MAX_HISTORY_QUERY_BYTES, decode=True)
            since, until = _seconds(params, "since"), _seconds(params, "until")
            limit = _page_size(params.get("limit"))
            key = (HISTORY, since, until, params.get("gpu"), limit, params.get("after"))
            build = lambda: self._history(since, until, params.get("gpu"),  # noqa: E731
                                          params.get("after"), limit)
        elif path == POWER:
            q = power_query(query, snap)
            key = (POWER, q.seconds, q.gpu)
            build = lambda: power_body(snap, q)  # noqa: E731
        elif path == HEALTH:
            parse_query(query, ())
            key = (HEALTH,)
            build = lambda: health_body(rendered.verdict)  # noqa: E731
        else:
            parse_query(query, ())
            key = (FINDINGS,)
            build = lambda: findings_body(rendered.published,  # noqa: E731
                                          self.readiness(rendered), self.node, self.history)
        # One build at a time, under the lock: concurrent viewers of a new snapshot wait
        # for the first one's build instead of each making their own, and the API never
        # takes more than one core from sampling and scrapes.
        with self._lock:
            if self._for is not rendered:
                self._for, self._answers = rendered, {}
            answer = self._answers.get(key)
            if answer is None:
                answer = Answer(build())
                if len(self._answers) < MAX_ANSWERS_KEPT:
                    self._answers[key] = answer
            return answer

    def _history(self, since: float | None, until: float | None, gpu: str | None,
                 after: str | None, limit: int) -> bytes:
        """/api/v1/history?gpu=I|UUID|SERIAL|node&since=S&until=U&limit=N&after=NEXT (unix
        seconds; a page of episodes): read from the state directory, once per snapshot and
        query like the other answers."""
        if self.history is None:
            raise BadRequest("no history is kept here (--storage.path)")
        try:
            return history_body(self.history, since, until, gpu, after, limit)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
