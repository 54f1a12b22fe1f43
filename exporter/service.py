"""Running as a service: signals, reload on SIGHUP, and systemd's notify protocol.

SIGINT and SIGTERM stop the exporter. SIGHUP reloads, all or nothing: the config file
is read and validated again (flags still win over it) and the web config and metric
selection files it names are loaded again (certificates, keys, users; families); only if
all are good is anything applied, else one log line says why and the running config
stays. A web config that would take away TLS or authentication the server has is
refused the same way, unless the new config sets web_allow_security_downgrade. What
applies live: the web config (new connections get the new certificate, each request the
new users), the log level and the metric profile and selection (from the next snapshot;
NVLink fields from the next device read). Keys that need sampling
restarted are named in one log line and keep their running values until the next start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import time
from typing import Any, Protocol

from exporter import sdnotify
from exporter.config import Config, build_config
from exporter.metrics.selection import Selection, load_selection
from exporter.web.downgrade import security_lost
from exporter.web.webconfig import WebConfig, load_web_config

log = logging.getLogger(__name__)

#: Config keys a reload applies to the running exporter.
LIVE_KEYS = frozenset({"web_config_file", "web_allow_security_downgrade", "log_level",
                       "metrics_profile", "metrics_file"})


class Reloadable(Protocol):
    config: Config
    web: WebConfig

    def apply_web_config(self, web: WebConfig) -> None: ...

    def apply_selection(self, selection: Selection) -> list[str]: ...

    def record_reload(self, ok: bool) -> None: ...

    def alive(self) -> bool: ...


def reload(exporter: Reloadable, config_path: str | None, overrides: dict[str, Any]) -> bool:
    """Load the config and web config files again; apply them only if both are good."""
    try:
        config = build_config(config_path, overrides)
        web = load_web_config(config.serving.web_config_file)
        selection = load_selection(config.metrics.profile, config.metrics.file)
    except Exception as exc:  # noqa: BLE001 - whatever is wrong, the old config stays
        log.error("reload refused, keeping the running config: %s", exc)
        exporter.record_reload(False)
        return False
    lost = security_lost(exporter.web, web)
    if lost and not config.serving.web_allow_security_downgrade:
        log.error("reload refused, keeping the running config: web config %s would take "
                  "away %s, which the server has; set web_allow_security_downgrade: true "
                  "(--web.allow-security-downgrade) to allow it",
                  config.serving.web_config_file or "(none)", _and(lost))
        exporter.record_reload(False)
        return False
    if lost:
        log.warning("reload: web config %s takes away %s (web_allow_security_downgrade is "
                    "set)", config.serving.web_config_file or "(none)", _and(lost))
    running, new = exporter.config.values(), config.values()
    restart = [key for key in running if key not in LIVE_KEYS and running[key] != new[key]]
    exporter.apply_web_config(web)
    started = exporter.apply_selection(selection)
    logging.getLogger().setLevel(config.log.log_level.upper())
    exporter.config = exporter.config.replace(**{key: new[key] for key in LIVE_KEYS})
    log.info("reloaded %s: web config %s (%s%s), log level %s, metrics %s",
             config_path or "flags", config.serving.web_config_file or "none",
             "TLS" if web.tls else "plain HTTP",
             f", basic auth for {len(web.users)} user(s)" if web.auth else "",
             config.log.log_level, selection.describe())
    if started:
        log.info("reload: started the %s collector%s, which %s now needs", ", ".join(started),
                 "" if len(started) == 1 else "s", selection.describe())
    if restart:
        log.warning("reload: %s changed but need%s a restart; running with the old "
                    "value%s until then", ", ".join(restart), "s" if len(restart) == 1 else "",
                    "" if len(restart) == 1 else "s")
    exporter.record_reload(True)
    return True


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


class Signals:
    """SIGINT/SIGTERM ask to stop, SIGHUP to reload. Installed before the exporter starts,
    so a SIGHUP during start-up is kept for later instead of killing the process (its
    default action).

    The kernel may deliver a signal to any thread, and Python runs its handler only once
    the main thread runs bytecode again; so each signal also writes a byte to a pipe
    (`signal.set_wakeup_fd`: the C-level handler does, on whatever thread), and the main
    thread sleeps on that pipe (`wait`) until a signal or its next duty: no polling."""

    def __init__(self) -> None:
        self.stop = False
        self.reload = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)

    def _on_stop(self, *_: object) -> None:
        self.stop = True

    def _on_hup(self, *_: object) -> None:
        self.reload = True

    def wait(self, timeout: float | None) -> None:
        """Sleep until a signal comes (its handler runs once the caller runs on) or
        `timeout` seconds pass (None: no limit)."""
        select.select([self._read], [], [], timeout)
        with contextlib.suppress(BlockingIOError):
            os.read(self._read, 512)

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)


def serve(exporter: Reloadable, signals: Signals, config_path: str | None,
          overrides: dict[str, Any]) -> None:
    """The main thread's loop once the exporter serves: reloads, watchdog pings, stop.
    It sleeps until a signal or the next watchdog ping; a flag a handler sets is seen
    at the top of the loop, after the handler has run."""
    sdnotify.notify("READY=1")
    interval = sdnotify.watchdog_interval()
    next_ping = time.monotonic()
    while True:
        if signals.stop:
            sdnotify.notify("STOPPING=1")
            return
        if signals.reload:
            signals.reload = False
            sdnotify.reloading()
            reload(exporter, config_path, overrides)
            sdnotify.notify("READY=1")
        if interval is not None and time.monotonic() >= next_ping:
            next_ping = time.monotonic() + interval
            if exporter.alive():
                # only while liveness holds: a stuck publisher gets the service restarted
                sdnotify.notify("WATCHDOG=1")
        signals.wait(None if interval is None else max(0.0, next_ping - time.monotonic()))
