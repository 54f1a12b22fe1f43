"""The serving side's self-metrics: HTTP connections, config reloads, TLS certificate."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter.families import Family
from exporter.web.stats import HttpStats, ReloadStats

MAX_CONNECTIONS = Family(
    "cte_http_max_connections", "gauge",
    "Cap on open HTTP connections (one thread each); at the cap an idle or half-read one "
    "is evicted.", source="server", doc="Cap on open HTTP connections (one thread each; 128).")
CONNECTIONS = Family(
    "cte_http_connections", "gauge",
    "Open HTTP connections by state: head (handshake or request head being read), idle "
    "(keep-alive), busy (being answered).", ("state",), source="server",
    doc="Open connections by state: `head` (TLS handshake or request head being read), "
        "`idle` (keep-alive, between requests), `busy` (being answered).")
EVICTIONS = Family(
    "cte_http_connection_evictions_total", "counter",
    "Connections closed at the cap to let a new one in, by the state they were in (idle "
    "first, then head).", ("state",), source="server",
    doc="Connections closed at the cap to let a new one in, by the state they were in: "
        "`idle` first (longest idle, never one whose next request has arrived), `head` only "
        "when none is idle. A rising `head` rate means slow clients (or a flood of them).")
REFUSED = Family(
    "cte_http_connections_refused_total", "counter",
    "New connections refused because every open connection was busy answering.",
    source="server",
    doc="New connections refused because every open connection was busy answering (503 on "
        "plain HTTP).")
HEAD_TIMEOUTS = Family(
    "cte_http_request_head_timeouts_total", "counter",
    "Connections cut off because the TLS handshake and request head took too long in "
    "total.", source="server",
    doc="Connections cut off because the TLS handshake and request head took over 10 s in "
        "total (slowloris).")
BUSY_RESPONSES = Family(
    "cte_http_busy_responses_total", "counter",
    "Requests answered 503 because no request slot came free in time.", source="server",
    doc="Requests answered 503 because none of the 8 request slots came free within 1 s.")
RELOADS = Family(
    "cte_config_reloads_total", "counter",
    "Config reloads (SIGHUP), by result; a failed one keeps the running config.",
    ("result",), source="reload",
    doc="Config reloads (SIGHUP) by `result`: `success` or `failure` (a refused file; the "
        "running config stays).")
LAST_RELOAD_SUCCESSFUL = Family(
    "cte_config_last_reload_successful", "gauge",
    "1 if the last config load (start or reload) succeeded.", source="reload",
    doc="1 if the last load of the config and web config files (at start or SIGHUP) "
        "succeeded.")
LAST_RELOAD_SUCCESS_TIME = Family(
    "cte_config_last_reload_success_timestamp_seconds", "gauge",
    "When the config was last loaded successfully (epoch).", unit="s", source="reload",
    doc="When the config was last loaded successfully (Unix time; the start counts).")
TLS_EXPIRY = Family(
    "cte_tls_certificate_expiry_timestamp_seconds", "gauge",
    "When the served TLS certificate expires (epoch).", unit="s", source="web config",
    doc="When the served TLS certificate expires (Unix time); alert on "
        "`cte_tls_certificate_expiry_timestamp_seconds - time() < 14 * 86400`. (present "
        "only when TLS is on and the `cryptography` package is installed: the `tls` extra, "
        "`pip install '.[tls]'` from the repository, or the distribution's "
        "`python3-cryptography`.) Without it the certificate is served all the same, but "
        "its expiry is neither exported nor warned about, and a warning at every load says "
        "so.")

DECLARED = (MAX_CONNECTIONS, CONNECTIONS, EVICTIONS, REFUSED, HEAD_TIMEOUTS, BUSY_RESPONSES,
            RELOADS, LAST_RELOAD_SUCCESSFUL, LAST_RELOAD_SUCCESS_TIME, TLS_EXPIRY)


def http_families(stats: HttpStats) -> Iterator[Metric]:
    yield MAX_CONNECTIONS.gauge(stats.max_connections)
    yield CONNECTIONS.by_label(dict(sorted(stats.connections.items())))
    yield EVICTIONS.by_label(dict(sorted(stats.evictions.items())))
    yield REFUSED.counter(stats.refused_total)
    yield HEAD_TIMEOUTS.counter(stats.head_timeouts_total)
    yield BUSY_RESPONSES.counter(stats.busy_responses_total)


def reload_families(stats: ReloadStats) -> Iterator[Metric]:
    yield RELOADS.by_label({"success": stats.successes_total, "failure": stats.failures_total})
    yield LAST_RELOAD_SUCCESSFUL.gauge(float(stats.last_successful))
    yield LAST_RELOAD_SUCCESS_TIME.gauge(stats.last_success_time)


def tls_families(not_after: float | None) -> Iterator[Metric]:
    if not_after is not None:
        yield TLS_EXPIRY.gauge(not_after)
