"""Warnings about the TLS files a web config names: who may read or replace the private
key, and whether the certificate is valid now. Checked at every load (start and reload).

These warn rather than refuse: an expired certificate or a loose key is an operator's
mistake to fix, and refusing it would turn a running fleet into a restart loop that
serves nothing. The expiry is also a metric (cte_tls_certificate_expiry_timestamp_seconds)
so an alert can fire before it happens.
"""

from __future__ import annotations

import logging
import os
import ssl
import stat
import time

log = logging.getLogger(__name__)

EXPIRY_WARNING_SECONDS = 14 * 86400


def certificate_dates(path: str) -> tuple[float, float] | None:
    """(notBefore, notAfter) of the first certificate in a PEM file, as epoch seconds.

    The stdlib decodes certificates only through this private helper (no new
    dependency for it); None if it is missing or cannot read the file."""
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return None
    try:
        fields = decode(path)
        return (ssl.cert_time_to_seconds(fields["notBefore"]),
                ssl.cert_time_to_seconds(fields["notAfter"]))
    except (ssl.SSLError, OSError, KeyError, ValueError):
        return None


def check_certificate(path: str, now: float | None = None) -> float | None:
    """Warn about a certificate not valid now or soon to expire; its notAfter (or None)."""
    dates = certificate_dates(path)
    if dates is None:
        return None
    now = time.time() if now is None else now
    not_before, not_after = dates
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(not_after))
    if not_after <= now:
        log.warning("%s: the TLS certificate expired on %s; clients that verify it will "
                    "refuse every scrape: renew it and reload (SIGHUP)", path, when)
    elif not_before > now:
        log.warning("%s: the TLS certificate is not valid before %s; clients that verify it "
                    "will refuse it until then", path,
                    time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(not_before)))
    elif not_after - now < EXPIRY_WARNING_SECONDS:
        log.warning("%s: the TLS certificate expires in %.1f days (%s): renew it and reload "
                    "(SIGHUP)", path, (not_after - now) / 86400, when)
    return not_after


def check_key_permissions(path: str) -> list[str]:
    """Warn when others may read the private key or anyone but its owner may replace it."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return []
    problems = []
    if mode & stat.S_IWOTH:
        problems.append("writable by every user")
    elif mode & stat.S_IWGRP:
        problems.append("writable by its group")
    if mode & stat.S_IROTH:
        problems.append("readable by every user")
    for problem in problems:
        log.warning("%s: the TLS private key is %s (mode %04o); make it 0640 (owner root, "
                    "group of the service) or 0600", path, problem, stat.S_IMODE(mode))
    return problems
