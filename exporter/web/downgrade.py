"""What a new web config would take away from the running one: TLS, basic auth, client
certificates, the client SAN allow-list, or a path's password.

A reload that takes any of them away is refused unless `web_allow_security_downgrade` is
set (exporter/service.py): an empty file, or `tls_server_config:` alone, parses as a
valid config with no TLS and no users, and serving plain HTTP without a password after
a slip in config management is worse than serving the old config.
"""

from __future__ import annotations

from exporter.web.webconfig import CLIENT_AUTH_TYPES, WebConfig

# how much a client must prove with its certificate, by the name of the verify mode (the
# names: ssl's members would load ssl in a plain-HTTP exporter, exporter/lazy.py)
_CLIENT_CERTIFICATES = {"CERT_NONE": 0, "CERT_OPTIONAL": 1, "CERT_REQUIRED": 2}
# the web config's client_auth_type for each verify mode it can set
_CLIENT_AUTH_NAMES = {mode: name for name, (mode, _) in CLIENT_AUTH_TYPES.items()}


def security_lost(running: WebConfig, new: WebConfig) -> list[str]:
    """What the server has now that `new` would no longer ask of a client, in words
    (empty when nothing is lost)."""
    lost = []
    if running.tls and not new.tls:
        lost.append("TLS")
    if running.auth and not new.auth:
        lost.append("basic auth")
    elif running.auth:
        opened = sorted(new.auth_excluded_paths - running.auth_excluded_paths)
        if opened:
            lost.append(f"basic auth for {', '.join(opened)} (basic_auth_excluded_paths)")
    if running.ssl_context is not None and new.ssl_context is not None:
        was, now = running.ssl_context.verify_mode.name, new.ssl_context.verify_mode.name
        if _CLIENT_CERTIFICATES[now] < _CLIENT_CERTIFICATES[was]:
            lost.append(f"client certificates (client_auth_type {_CLIENT_AUTH_NAMES[was]} "
                        f"to {_CLIENT_AUTH_NAMES[now]})")
        elif running.allowed_sans and not new.allowed_sans:
            lost.append("the client SAN allow-list (client_allowed_sans)")
    return lost
