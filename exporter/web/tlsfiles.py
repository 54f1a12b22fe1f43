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
import stat
import time

log = logging.getLogger(__name__)

EXPIRY_WARNING_SECONDS = 14 * 86400


def certificate_dates(path: str) -> tuple[float, float] | None:
    """(notBefore, notAfter) of the first certificate in a PEM file, as epoch seconds.

    Read with the `cryptography` package (the `tls` extra); without it, or if the file
    cannot be read, None: the expiry is then neither warned about nor exported."""
    try:
        from cryptography import x509
    except ImportError:
        return None
    try:
        with open(path, "rb") as file:
            cert = x509.load_pem_x509_certificate(file.read())
    except (OSError, ValueError):
        return None
    return (cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp())


def can_read_dates() -> bool:
    try:
        import cryptography.x509  # noqa: F401 - only whether it is there
    except ImportError:
        return False
    return True


def check_certificate(path: str, now: float | None = None,
                      label: str | None = None) -> float | None:
    """Warn about a certificate not valid now or soon to expire; its notAfter (or None).
    `label` names it in the warnings (an inline certificate has no file of its own)."""
    dates = certificate_dates(path)
    name = label or path
    if dates is None:
        if not can_read_dates():
            log.warning("%s: the TLS certificate's expiry is not checked or exported "
                        "(cte_tls_certificate_expiry_timestamp_seconds) without the "
                        "cryptography package: pip install 'cluster-telemetry-exporter[tls]'",
                        name)
        return None
    now = time.time() if now is None else now
    not_before, not_after = dates
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(not_after))
    if not_after <= now:
        log.warning("%s: the TLS certificate expired on %s; clients that verify it will "
                    "refuse every scrape: renew it and reload (SIGHUP)", name, when)
    elif not_before > now:
        log.warning("%s: the TLS certificate is not valid before %s; clients that verify it "
                    "will refuse it until then", name,
                    time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(not_before)))
    elif not_after - now < EXPIRY_WARNING_SECONDS:
        log.warning("%s: the TLS certificate expires in %.1f days (%s): renew it and reload "
                    "(SIGHUP)", name, (not_after - now) / 86400, when)
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
