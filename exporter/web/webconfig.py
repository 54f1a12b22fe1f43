"""The web config file (--web.config.file): TLS and basic auth, in the Prometheus
exporter-toolkit format, so one file serves node_exporter and this exporter alike.

    tls_server_config:
      cert_file: server.crt            # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional
      client_ca_file: clients-ca.crt                 # needed by the verifying types
      min_version: TLS12                             # TLS12 or TLS13, default TLS12
      max_version: TLS13
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2y$10$...           # bcrypt hashes only (htpasswd -nBC 10 "")

The file is read at start and again on SIGHUP (exporter/service.py). Every mistake
is a ConfigError naming the file, line and key. Keys of the format that Python's TLS
cannot honour (Go cipher suite names, curve preferences, unverified client
certificates, TLS 1.0 and 1.1) are refused with a clear line instead of being silently
ignored. A loose private key or a certificate not valid now is accepted with a warning
(exporter/web/tlsfiles.py).
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from exporter.regularfile import read_regular
from exporter.web.tlsfiles import check_certificate, check_key_permissions
from exporter.yamlfile import LineDict, Where, excerpt, expect_mapping, load_yaml_file

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

_LEGACY_TLS = ("TLS10", "TLS11")  # names of the format that no handshake here can use

# client_auth_type -> (verify mode, needs client_ca_file)
CLIENT_AUTH_TYPES = {
    "NoClientCert": (ssl.CERT_NONE, False),
    "VerifyClientCertIfGiven": (ssl.CERT_OPTIONAL, True),
    "RequireAndVerifyClientCert": (ssl.CERT_REQUIRED, True),
}
_UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")

# The only response headers exporter-toolkit lets a web config set.
ALLOWED_HEADERS = ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options",
                   "X-XSS-Protection", "Strict-Transport-Security")

_TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users"}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
             "max_version"}
_TLS_UNSUPPORTED = {
    "cipher_suites": "Go cipher suite names; Python uses OpenSSL's defaults",
    "curve_preferences": "Go curve names; Python uses OpenSSL's defaults",
    "prefer_server_cipher_suites": "Go-only setting",
    "client_allowed_sans": "not implemented; use a dedicated client CA instead",
    "cert": "inline certificates are not implemented; use cert_file",
    "key": "inline keys are not implemented; use key_file",
    "client_ca": "inline CAs are not implemented; use client_ca_file",
}
_HTTP_KEYS = {"headers", "http2"}
_HTTP_UNSUPPORTED = {"rate_limit": "not implemented; connection and request limits are built in"}

# $2a$, $2b$, $2y$ (htpasswd) and $2x$, cost 04-31, 22 salt + 31 hash characters.
BCRYPT_HASH = re.compile(r"^\$2[abxy]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")


@dataclass(frozen=True)
class WebConfig:
    """What the HTTP server needs: a TLS context (or None) and basic-auth users."""

    source: str = ""
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    certificate_not_after: float | None = None  # epoch; None without TLS or if unreadable

    @property
    def tls(self) -> bool:
        return self.ssl_context is not None

    @property
    def auth(self) -> bool:
        return bool(self.users)


def load_web_config(path: str | Path | None) -> WebConfig:
    """Parse and check the file; raise ConfigError naming file, line and key."""
    if not path:
        return WebConfig()
    data = load_yaml_file(path)
    where = Where(str(path), data)
    top = expect_mapping(data, where, _TOP_KEYS)
    base = Path(path).resolve().parent
    context, not_after = _tls_context(_section(top, "tls_server_config", where), base)
    users = _users(_section(top, "basic_auth_users", where))
    headers = _headers(_section(top, "http_server_config", where))
    return WebConfig(str(path), context, users, headers, not_after)


def _section(top: dict, key: str, where: Where) -> tuple[dict, Where]:
    value = top.get(key)
    if value is None:
        return LineDict(), where.child(key)
    if not isinstance(value, dict):
        raise where.error(key, f"expected a mapping, got {type(value).__name__}")
    return value, where.child(key, value)


def _strings(mapping: dict, where: Where, keys: set[str], unsupported: dict[str, str]) -> None:
    for key, why in unsupported.items():
        if key in mapping:
            raise where.error(key, f"not supported by cluster-telemetry-exporter ({why})")
    expect_mapping(mapping, where, keys)


def _text(mapping: dict, key: str, where: Where) -> str:
    value = mapping.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise where.error(key, f"expected a string, got {excerpt(value)}")
    return value


def _readable_pem(mapping: dict, key: str, where: Where, base: Path) -> str:
    name = _text(mapping, key, where)
    path = Path(name) if Path(name).is_absolute() else base / name
    try:
        data = read_regular(path)  # OpenSSL opens it again by name: a FIFO would hang it
    except OSError as exc:
        raise where.error(key, f"cannot read {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise where.error(key, f"{path} is not a PEM file")
    return str(path)


def _tls_context(section: tuple[dict, Where],
                 base: Path) -> tuple[ssl.SSLContext | None, float | None]:
    """The server's TLS context (None: plain HTTP) and its certificate's notAfter."""
    mapping, where = section
    _strings(mapping, where, _TLS_KEYS, _TLS_UNSUPPORTED)
    cert, key = _text(mapping, "cert_file", where), _text(mapping, "key_file", where)
    if not cert and not key:
        for other in ("client_auth_type", "client_ca_file", "min_version", "max_version"):
            if _text(mapping, other, where):
                raise where.error(other, "needs cert_file and key_file (TLS is off without them)")
        return None, None  # exporter-toolkit too serves plain HTTP without a certificate
    if not cert:
        raise where.error("key_file", "key_file is set but cert_file is missing")
    if not key:
        raise where.error("cert_file", "cert_file is set but key_file is missing")
    cert_path = _readable_pem(mapping, "cert_file", where, base)
    key_path = _readable_pem(mapping, "key_file", where, base)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.set_alpn_protocols(["http/1.1"])
    low = _version(mapping, "min_version", where, "TLS12")
    high = _version(mapping, "max_version", where, "TLS13")
    if low > high:
        raise where.error("max_version", "is lower than min_version")
    try:
        context.minimum_version, context.maximum_version = low, high
    except (ValueError, ssl.SSLError) as exc:
        raise where.error("min_version", f"not available in this OpenSSL: {exc}") from None
    try:
        context.load_cert_chain(cert_path, key_path)
    except ssl.SSLError as exc:
        raise where.error("key_file", f"{cert_path} and {key_path} are not a matching certificate "
                          f"and private key ({exc.reason or exc})") from None

    auth_type = _text(mapping, "client_auth_type", where) or "NoClientCert"
    if auth_type in _UNVERIFIED_CLIENT_AUTH:
        raise where.error("client_auth_type", f"{auth_type} (unverified client certificates) "
                          "is not supported; use VerifyClientCertIfGiven or "
                          "RequireAndVerifyClientCert")
    if auth_type not in CLIENT_AUTH_TYPES:
        raise where.error("client_auth_type", "expected one of " + ", ".join(CLIENT_AUTH_TYPES))
    mode, needs_ca = CLIENT_AUTH_TYPES[auth_type]
    if _text(mapping, "client_ca_file", where):
        ca_path = _readable_pem(mapping, "client_ca_file", where, base)
        try:
            context.load_verify_locations(cafile=ca_path)
        except ssl.SSLError as exc:
            raise where.error("client_ca_file", f"{ca_path}: not a CA certificate "
                              f"({exc.reason or exc})") from None
    elif needs_ca:
        raise where.error("client_auth_type", f"{auth_type} needs client_ca_file")
    context.verify_mode = mode
    check_key_permissions(key_path)
    return context, check_certificate(cert_path)


def _version(mapping: dict, key: str, where: Where, default: str) -> ssl.TLSVersion:
    name = _text(mapping, key, where) or default
    if name not in TLS_VERSIONS:
        raise where.error(key, "expected one of " + ", ".join(TLS_VERSIONS))
    if name in _LEGACY_TLS:
        # Accepted, it changed nothing: Python's ssl leaves TLS 1.0 and 1.1 no cipher suite
        # (its default list at OpenSSL security level 2), so every such client was refused.
        raise where.error(key, f"{name} cannot be served: Python's ssl ({ssl.OPENSSL_VERSION}) "
                          "offers TLS 1.0 and 1.1 no cipher suite, so every client asking for "
                          "them is refused (RFC 8996 deprecates both); use TLS12 or TLS13")
    return TLS_VERSIONS[name]


def _users(section: tuple[dict, Where]) -> dict[str, bytes]:
    mapping, where = section
    users: dict[str, bytes] = {}
    for name, hashed in mapping.items():
        if not isinstance(name, str) or not name or ":" in name:
            raise where.error(str(name), "user names must be non-empty strings without ':'")
        if not isinstance(hashed, str) or not BCRYPT_HASH.match(hashed):
            raise where.error(name, "expected a bcrypt hash ($2y$10$... from htpasswd -nBC 10 \"\" "
                              "or python -c 'import bcrypt; print(bcrypt.hashpw(...))'); "
                              "plain-text passwords are not accepted")
        users[name] = hashed.encode()
    if users:
        try:
            import bcrypt  # noqa: F401 - a declared dependency; checked here to fail at start
        except ImportError:
            raise where.error(None, "basic_auth_users needs the bcrypt package "
                              "(pip install bcrypt)") from None
    return users


def _headers(section: tuple[dict, Where]) -> dict[str, str]:
    mapping, where = section
    _strings(mapping, where, _HTTP_KEYS, _HTTP_UNSUPPORTED)
    if "http2" in mapping and not isinstance(mapping["http2"], bool):
        raise where.error("http2", f"expected true or false, got {excerpt(mapping['http2'])}")
    raw = mapping.get("headers") or {}
    if not isinstance(raw, dict):
        raise where.error("headers", f"expected a mapping, got {type(raw).__name__}")
    hwhere = where.child("headers", raw)
    headers: dict[str, str] = {}
    for name, value in raw.items():
        if name not in ALLOWED_HEADERS:
            raise hwhere.error(str(name), "not one of the settable headers: "
                               + ", ".join(ALLOWED_HEADERS))
        if not isinstance(value, str) or "\n" in value or "\r" in value:
            raise hwhere.error(name, "expected a one-line string")
        headers[name] = value
    return headers
