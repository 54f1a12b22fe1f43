"""client_allowed_sans: a verified client certificate must carry one of these SANs.

As exporter-toolkit does (web/tls_config.go, VerifyPeerCertificate), any DNS name, email
address, IP address or URI in the certificate's Subject Alternative Names that equals an
allowed entry admits the client. IP addresses are compared as addresses, so ::1 matches
0:0:0:0:0:0:0:1 (Python and Go spell them differently).
"""

from __future__ import annotations

import ipaddress


def _normal(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return value


def normalized_sans(allowed: list[str]) -> frozenset[str]:
    return frozenset(_normal(value) for value in allowed)


def peer_sans(peer_cert: dict | None) -> set[str]:
    """The SAN values of a certificate as ssl.SSLSocket.getpeercert() returns it."""
    kinds = ("DNS", "email", "IP Address", "URI")
    return {_normal(value) for kind, value in (peer_cert or {}).get("subjectAltName", ())
            if kind in kinds}


def admitted(peer_cert: dict | None, allowed: frozenset[str]) -> bool:
    """True when no allow-list is set or the certificate has an allowed SAN."""
    return not allowed or bool(peer_sans(peer_cert) & allowed)
