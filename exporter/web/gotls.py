"""Go's TLS names (as exporter-toolkit web configs spell them) in OpenSSL's terms.

cipher_suites and curve_preferences name Go constants (crypto/tls); Python's ssl
speaks OpenSSL. The suites are those Go's tls.CipherSuites() lists, the only ones
exporter-toolkit accepts; the OpenSSL names are from OpenSSL's ciphers(1) table
(RFC name -> OpenSSL name). Go's tls.InsecureCipherSuites() are refused by
exporter-toolkit too ("unknown cipher"), so they are refused here.

TLS 1.3 suites cannot be chosen in Go ("TLS 1.3 ciphersuites are not configurable"),
and Python's SSLContext.set_ciphers does not choose them either: both accept the
names and keep the TLS 1.3 defaults.
"""

from __future__ import annotations

import ssl

# Go's tls.CipherSuites(), TLS 1.0-1.2 -> OpenSSL name.
TLS12_SUITES = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
}
# Go's tls.CipherSuites(), TLS 1.3: accepted and, as in Go, not configurable.
TLS13_SUITES = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384",
                "TLS_CHACHA20_POLY1305_SHA256")
# Go's tls.InsecureCipherSuites(): exporter-toolkit refuses them.
INSECURE_SUITES = ("TLS_RSA_WITH_RC4_128_SHA", "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
                   "TLS_RSA_WITH_AES_128_CBC_SHA256", "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
                   "TLS_ECDHE_RSA_WITH_RC4_128_SHA", "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
                   "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
                   "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256")

# Go's tls.CurveID names -> OpenSSL group names.
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1",
          "X25519": "X25519"}
# Known to newer Go; OpenSSL gained ML-KEM in 3.5.
NEWER_CURVES = {"X25519MLKEM768": "X25519MLKEM768"}


class Refused(ValueError):
    """A setting this Python's ssl cannot honour; the message says why."""


def cipher_string(names: list[str]) -> str | None:
    """OpenSSL's cipher string for Go suite names, in their order (None: TLS 1.3 only)."""
    chosen = []
    for name in names:
        if name in TLS12_SUITES:
            chosen.append(TLS12_SUITES[name])
        elif name in INSECURE_SUITES:
            raise Refused(f"{name} is one of Go's insecure suites, which exporter-toolkit "
                          "refuses too")
        elif name not in TLS13_SUITES:
            raise Refused(f"unknown cipher suite {name!r}; expected Go names such as "
                          "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256")
    return ":".join(chosen) or None


def set_curves(context: ssl.SSLContext, names: list[str]) -> None:
    """Restrict the key exchange to these curves, in this order, or raise Refused."""
    groups = []
    for name in names:
        if name in NEWER_CURVES:
            groups.append(NEWER_CURVES[name])
        elif name in CURVES:
            groups.append(CURVES[name])
        else:
            raise Refused(f"unknown curve {name!r}; expected one of " + ", ".join(CURVES))
    set_groups = getattr(context, "set_groups", None)  # SSLContext.set_groups: CPython 3.15
    try:
        if set_groups is not None:
            set_groups(":".join(groups))
        elif len(groups) == 1:
            context.set_ecdh_curve(groups[0])
        else:
            raise Refused("this Python's ssl restricts the key exchange to one curve only "
                          "(SSLContext.set_ecdh_curve; several need SSLContext.set_groups, "
                          "CPython 3.15): list one curve, or leave curve_preferences out to "
                          "offer OpenSSL's defaults (X25519, P-256, X448, P-521, P-384)")
    except (ValueError, ssl.SSLError) as exc:
        if isinstance(exc, Refused):
            raise
        raise Refused(f"{', '.join(names)}: not available in {ssl.OPENSSL_VERSION}"
                      + (" (ML-KEM needs OpenSSL 3.5 or later)"
                         if any(n in NEWER_CURVES for n in names) else "")) from None
