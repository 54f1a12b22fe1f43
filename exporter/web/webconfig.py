"""The web config file (--web.config.file): TLS and basic auth, in the Prometheus
exporter-toolkit format, so one file serves node_exporter and this exporter alike.

    tls_server_config:
      cert_file: server.crt            # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional
      client_ca_file: clients-ca.crt                 # else the system's CAs, as in Go
      client_allowed_sans: [prometheus.example.net]  # a client certificate SAN must match
      min_version: TLS12                             # TLS12 or TLS13, default TLS12
      max_version: TLS13
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]  # Go names, TLS 1.2 and older
      curve_preferences: [X25519]
      prefer_server_cipher_suites: true
    http_server_config:
      http2: true                      # accepted; served as HTTP/1.1
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2y$10$...           # bcrypt hashes only (htpasswd -nBC 10 "")
    basic_auth_excluded_paths: [/healthz]
    rate_limit: {interval: 100ms, burst: 10}     # exporter/web/ratelimit.py

The file is read at start and again on SIGHUP (exporter/service.py). Every mistake
is a ConfigError naming the file, line and key. Keys Python's TLS cannot honour
(unverified client certificates, TLS 1.0 and 1.1, several curves on a Python without
SSLContext.set_groups) are refused with a clear line instead of being silently
ignored. Inline PEM (cert, key, client_ca) reaches OpenSSL through
exporter/web/pemsource.py; Go names are translated in exporter/web/gotls.py. A loose
private key or a certificate not valid now is accepted with a warning
(exporter/web/tlsfiles.py).
"""

from __future__ import annotations

import contextlib
import logging
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter.regularfile import read_regular
from exporter.web.ratelimit import parse_go_duration
from exporter.yamlfile import LineDict, Where, excerpt, expect_mapping, kind_name, load_yaml_file

if TYPE_CHECKING:
    from exporter.web.pemsource import Pem

# by the names of ssl's members: naming them here would load ssl (OpenSSL) in an exporter
# that serves plain HTTP (exporter/lazy.py)
TLS_VERSIONS = {  # -> ssl.TLSVersion
    "TLS10": "TLSv1",
    "TLS11": "TLSv1_1",
    "TLS12": "TLSv1_2",
    "TLS13": "TLSv1_3",
}

_LEGACY_TLS = ("TLS10", "TLS11")  # names of the format that no handshake here can use

# client_auth_type -> (verify mode, whether it verifies: needs a CA, client_ca_file or the system's)
CLIENT_AUTH_TYPES = {  # the verify mode is ssl.VerifyMode's member of that name
    "NoClientCert": ("CERT_NONE", False),
    "VerifyClientCertIfGiven": ("CERT_OPTIONAL", True),
    "RequireAndVerifyClientCert": ("CERT_REQUIRED", True),
}
_UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")

# The only response headers exporter-toolkit lets a web config set, with the values it
# allows where it checks them (web/handler.go, extraHTTPHeaders).
ALLOWED_HEADERS = {"Content-Security-Policy": (), "X-Frame-Options": ("deny", "sameorigin"),
                   "X-Content-Type-Options": ("nosniff",), "X-XSS-Protection": (),
                   "Strict-Transport-Security": ()}

_TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users",
             "basic_auth_excluded_paths", "rate_limit"}
_TLS_KEYS = {"cert_file", "key_file", "cert", "key", "client_auth_type", "client_ca_file",
             "client_ca", "min_version", "max_version", "cipher_suites", "curve_preferences",
             "prefer_server_cipher_suites", "client_allowed_sans"}
_HTTP_KEYS = {"headers", "http2"}

log = logging.getLogger(__name__)

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
    allowed_sans: frozenset[str] = frozenset()  # empty: any verified client certificate
    auth_excluded_paths: frozenset[str] = frozenset()  # paths served without basic auth
    rate_limit: tuple[float, int] | None = None  # (interval seconds, burst); None: no limit

    @property
    def tls(self) -> bool:
        return self.ssl_context is not None

    @property
    def auth(self) -> bool:
        return bool(self.users)


def load_web_config(path: str | Path | None) -> WebConfig:
    """Parse and check the file; raise ConfigError naming file, line and key. Its helper
    modules (TLS files, Go names, inline PEM, client SANs) load only with a file."""
    if not path:
        return WebConfig()
    from exporter.web.clientsans import normalized_sans

    data = load_yaml_file(path)
    where = Where(str(path), data)
    top = expect_mapping(data, where, _TOP_KEYS)
    base = Path(path).resolve().parent
    tls = _section(top, "tls_server_config", where)
    context, not_after = _tls_context(tls, base)
    users = _users(_section(top, "basic_auth_users", where))
    headers = _headers(_section(top, "http_server_config", where))
    excluded = _strings_list(top, where, "basic_auth_excluded_paths")
    for excluded_path in excluded:
        if not excluded_path.startswith("/"):
            raise where.error("basic_auth_excluded_paths", f"{excluded_path!r}: expected a path "
                              "starting with /")
    return WebConfig(str(path), context, users, headers, not_after,
                     normalized_sans(_strings_list(*tls, "client_allowed_sans")),
                     frozenset(excluded), _rate_limit(_section(top, "rate_limit", where)))


def _section(top: dict, key: str, where: Where) -> tuple[dict, Where]:
    value = top.get(key)
    if value is None:
        return LineDict(), where.child(key)
    if not isinstance(value, dict):
        raise where.error(key, f"expected a mapping, got {kind_name(value)}")
    return value, where.child(key, value)


def _rate_limit(section: tuple[dict, Where]) -> tuple[float, int] | None:
    """rate_limit: {interval: <Go duration>, burst: <int>}; None when off (interval 0)."""
    mapping, where = section
    expect_mapping(mapping, where, {"interval", "burst"})
    interval: Any = mapping.get("interval", 0)
    burst: Any = mapping.get("burst", 0)
    if not isinstance(burst, int) or isinstance(burst, bool) or burst < 0:
        raise where.error("burst", f"expected a whole number, 0 or more, got {excerpt(burst)}")
    if interval == 0:
        return None
    try:
        seconds = parse_go_duration(interval) if isinstance(interval, str) else -1.0
    except ValueError as exc:
        raise where.error("interval", str(exc)) from None
    if seconds < 0:
        raise where.error("interval", f"expected a duration like 1s, got {excerpt(interval)}")
    if seconds == 0:
        return None
    if burst == 0:  # as Go's limiter: no token is ever there to take
        log.warning("%s: rate_limit with burst 0 answers every request but /healthz and "
                    "/readyz with 429", where.source)
    return seconds, burst


def _strings_list(mapping: dict, where: Where, key: str) -> list[str]:
    """A list of strings (absent or empty: [])."""
    value = mapping.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
        raise where.error(key, f"expected a list of strings, got {excerpt(value)}")
    return value


def _bool(mapping: dict, key: str, where: Where, default: bool) -> bool:
    value: Any = mapping.get(key, default)
    if not isinstance(value, bool):
        raise where.error(key, f"expected true or false, got {excerpt(value)}")
    return value


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
    from exporter.web.tlsfiles import check_certificate, check_key_permissions

    mapping, where = section
    expect_mapping(mapping, where, _TLS_KEYS)
    with contextlib.ExitStack() as inline_files:
        cert = _pem(mapping, where, base, "cert", inline_files)
        key = _pem(mapping, where, base, "key", inline_files)
        if cert is None and key is None:
            for other in sorted(_TLS_KEYS - {"cert_file", "key_file", "cert", "key"}):
                if mapping.get(other) not in (None, "", []):
                    raise where.error(other, "needs cert_file and key_file (TLS is off "
                                      "without them)")
            return None, None  # exporter-toolkit too serves plain HTTP without a certificate
        if cert is None:
            assert key is not None  # not both None: returned above
            raise where.error(key.key, f"{key.key} is set but cert_file (or cert) is missing")
        if key is None:
            raise where.error(cert.key, f"{cert.key} is set but key_file (or key) is missing")
        context = _context(mapping, where, base, cert, key)
        if not key.inline:
            check_key_permissions(key.path)
        return context, check_certificate(cert.path, label=cert.label)


def _pem(mapping: dict, where: Where, base: Path, name: str,
         inline_files: contextlib.ExitStack) -> Pem | None:
    """The PEM of `name`_file or inline `name` (cert, key, client_ca); None if neither."""
    from exporter.web.pemsource import Pem, inline_pem

    file_key = f"{name}_file"
    path, text = _text(mapping, file_key, where), _text(mapping, name, where)
    if path and text:
        raise where.error(name, f"set {file_key} or {name}, not both")
    if path:
        path = _readable_pem(mapping, file_key, where, base)
        return Pem(path, file_key, path)
    if not text:
        return None
    if "-----BEGIN " not in text:
        raise where.error(name, "is not PEM text (-----BEGIN ...)")
    return inline_files.enter_context(inline_pem(text, name, f"{where.source}: "
                                                 f"{where.path}.{name}"))


def _context(mapping: dict, where: Where, base: Path, cert: Pem, key: Pem) -> ssl.SSLContext:
    from exporter.web import gotls

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
    _ciphers(context, mapping, where, high)
    try:
        if mapping.get("curve_preferences"):
            gotls.set_curves(context, _strings_list(mapping, where, "curve_preferences"))
    except gotls.Refused as exc:
        raise where.error("curve_preferences", str(exc)) from None
    try:
        context.load_cert_chain(cert.path, key.path)
    except ssl.SSLError as exc:
        raise where.error(key.key, f"{cert.label} and {key.label} are not a matching "
                          f"certificate and private key ({exc.reason or exc})") from None
    _client_auth(context, mapping, where, base)
    return context


def _ciphers(context: ssl.SSLContext, mapping: dict, where: Where,
             high: ssl.TLSVersion) -> None:
    """cipher_suites (TLS 1.2 and older) and who picks among them."""
    from exporter.web import gotls

    if _bool(mapping, "prefer_server_cipher_suites", where, True):
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    names = _strings_list(mapping, where, "cipher_suites")
    if not names:
        return
    try:
        ciphers = gotls.cipher_string(names)
    except gotls.Refused as exc:
        raise where.error("cipher_suites", str(exc)) from None
    if ciphers is None:  # TLS 1.3 suites only: not configurable, in Go neither
        if high < ssl.TLSVersion.TLSv1_3:
            raise where.error("cipher_suites", "lists only TLS 1.3 suites, but max_version "
                              "is below TLS13: no suite would be left")
        return
    try:
        context.set_ciphers(ciphers)
    except ssl.SSLError:
        raise where.error("cipher_suites", f"none of {ciphers} is available in "
                          f"{ssl.OPENSSL_VERSION}") from None


def _client_auth(context: ssl.SSLContext, mapping: dict, where: Where, base: Path) -> None:
    auth_type = _text(mapping, "client_auth_type", where) or "NoClientCert"
    if auth_type in _UNVERIFIED_CLIENT_AUTH:
        raise where.error("client_auth_type", f"{auth_type} (unverified client certificates) "
                          "is not supported: Python's ssl verifies every certificate it "
                          "asks for; use VerifyClientCertIfGiven or RequireAndVerifyClientCert")
    if auth_type not in CLIENT_AUTH_TYPES:
        raise where.error("client_auth_type", "expected one of " + ", ".join(CLIENT_AUTH_TYPES))
    mode, verifies = CLIENT_AUTH_TYPES[auth_type]
    with contextlib.ExitStack() as inline_files:
        ca = _pem(mapping, where, base, "client_ca", inline_files)
        if ca is not None and not verifies:  # as exporter-toolkit: a CA without a policy
            raise where.error(ca.key, "is set but client_auth_type is NoClientCert; "
                              "set RequireAndVerifyClientCert")
        if ca is not None:
            try:
                context.load_verify_locations(cafile=ca.path)
            except ssl.SSLError as exc:
                raise where.error(ca.key, f"{ca.label}: not a CA certificate "
                                  f"({exc.reason or exc})") from None
    if ca is None and verifies:  # Go verifies against the system's CAs then; so do we, and say so
        context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        log.warning("%s: %s without client_ca_file trusts client certificates from every CA "
                    "this system trusts; set client_ca_file to your own CA",
                    where.source, auth_type)
    if mapping.get("client_allowed_sans") and auth_type != "RequireAndVerifyClientCert":
        raise where.error("client_allowed_sans", "needs client_auth_type "
                          "RequireAndVerifyClientCert (other types let a client connect "
                          "without a certificate, leaving no SAN to match)")
    context.verify_mode = ssl.VerifyMode[mode]


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
    return ssl.TLSVersion[TLS_VERSIONS[name]]


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
    expect_mapping(mapping, where, _HTTP_KEYS)
    if "http2" in mapping and not isinstance(mapping["http2"], bool):
        raise where.error("http2", f"expected true or false, got {excerpt(mapping['http2'])}")
    raw = mapping.get("headers") or {}
    if not isinstance(raw, dict):
        raise where.error("headers", f"expected a mapping, got {kind_name(raw)}")
    hwhere = where.child("headers", raw)
    headers: dict[str, str] = {}
    for name, value in raw.items():
        if name not in ALLOWED_HEADERS:
            raise hwhere.error(str(name), "not one of the settable headers: "
                               + ", ".join(ALLOWED_HEADERS))
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise hwhere.error(name, f"expected a one-line string, got {excerpt(value)}")
        text = str(value)  # YAML reads `X-XSS-Protection: 1` as a number; Go as a string
        if "\n" in text or "\r" in text:
            raise hwhere.error(name, "expected a one-line string")
        allowed = ALLOWED_HEADERS[name]
        if allowed and text not in allowed:
            raise hwhere.error(name, f"expected one of {', '.join(allowed)}, got {text!r}")
        if text:  # blank: unset, as in exporter-toolkit
            headers[name] = text
    return headers
