"""The serving side's self-metrics: HTTP connections, config reloads, TLS certificate."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.web.stats import HttpStats, ReloadStats


def http_families(stats: HttpStats) -> Iterator[Metric]:
    yield GaugeMetricFamily("cte_http_max_connections", "Cap on open HTTP connections (one "
                            "thread each); at the cap an idle or half-read one is evicted.",
                            value=stats.max_connections)
    conns = GaugeMetricFamily("cte_http_connections", "Open HTTP connections by state: head "
                              "(handshake or request head being read), idle (keep-alive), "
                              "busy (being answered).", labels=["state"])
    for state, count in sorted(stats.connections.items()):
        conns.add_metric([state], count)
    yield conns
    evictions = CounterMetricFamily("cte_http_connection_evictions", "Connections closed at "
                                    "the cap to let a new one in, by the state they were in "
                                    "(idle first, then head).", labels=["state"])
    for state, count in sorted(stats.evictions.items()):
        evictions.add_metric([state], count)
    yield evictions
    yield CounterMetricFamily("cte_http_connections_refused", "New connections refused "
                              "because every open connection was busy answering.",
                              value=stats.refused_total)
    yield CounterMetricFamily("cte_http_request_head_timeouts", "Connections cut off because "
                              "the TLS handshake and request head took too long in total.",
                              value=stats.head_timeouts_total)
    yield CounterMetricFamily("cte_http_busy_responses", "Requests answered 503 because no "
                              "request slot came free in time.", value=stats.busy_responses_total)


def reload_families(stats: ReloadStats) -> Iterator[Metric]:
    reloads = CounterMetricFamily("cte_config_reloads", "Config reloads (SIGHUP), by result; "
                                  "a failed one keeps the running config.", labels=["result"])
    reloads.add_metric(["success"], stats.successes_total)
    reloads.add_metric(["failure"], stats.failures_total)
    yield reloads
    yield GaugeMetricFamily("cte_config_last_reload_successful", "1 if the last config load "
                            "(start or reload) succeeded.", value=float(stats.last_successful))
    yield GaugeMetricFamily("cte_config_last_reload_success_timestamp_seconds",
                            "When the config was last loaded successfully (epoch).",
                            value=stats.last_success_time)


def tls_families(not_after: float | None) -> Iterator[Metric]:
    if not_after is not None:
        yield GaugeMetricFamily("cte_tls_certificate_expiry_timestamp_seconds",
                                "When the served TLS certificate expires (epoch).",
                                value=not_after)
