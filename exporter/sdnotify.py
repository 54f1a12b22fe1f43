"""systemd's notify protocol (sd_notify(3)) without a dependency: one datagram a message.

With `Type=notify` systemd waits for `READY=1` before it calls the service started, and
with `WatchdogSec=` it restarts the service when `WATCHDOG=1` stops coming. Outside
systemd ($NOTIFY_SOCKET unset) every call does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger(__name__)


def notify(message: str) -> bool:
    """Send one message ("READY=1", "WATCHDOG=1", ...); False if not under systemd."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address or address[0] not in "/@":
        return False
    if address[0] == "@":  # a Linux abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log.warning("cannot notify systemd at %s: %s", address.lstrip("\0"), exc)
        return False
    return True


def reloading() -> bool:
    """RELOADING=1 carries the monotonic time, as systemd 253+ requires for notify-reload."""
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify(f"RELOADING=1\nMONOTONIC_USEC={usec}")


def watchdog_interval() -> float | None:
    """How often to send WATCHDOG=1 (half of WatchdogSec), or None without a watchdog."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None  # meant for another process (we were started by a wrapper)
    return int(usec) / 2e6
