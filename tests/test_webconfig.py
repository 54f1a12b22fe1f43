"""The web config file: exporter-toolkit format, and one clear line for every mistake."""

from __future__ import annotations

import ssl
import subprocess
import sys
import time

import pytest

from exporter.web.webconfig import load_web_config
from exporter.yamlfile import ConfigError
from tests.certs import make_certs
from tests.tools import require_module

CLI = [sys.executable, "-m", "exporter"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def hashed():
    bcrypt = require_module("bcrypt")
    return bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()


def write(directory, text: str):
    path = directory / "web.yml"
    path.write_text(text)
    return path


def test_no_file_is_plain_http_without_auth():
    web = load_web_config("")
    assert not web.tls and not web.auth


def test_full_config_relative_paths_and_htpasswd_hashes(tmp_path, certs, hashed):
    for name in ("ca.crt", "server.crt", "server.key"):
        (tmp_path / name).write_bytes((certs.ca.parent / name).read_bytes())
    htpasswd_style = "$2y$" + hashed[4:]
    web = load_web_config(write(tmp_path, f"""
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
  min_version: TLS13
http_server_config:
  http2: false
  headers:
    Strict-Transport-Security: max-age=31536000
basic_auth_users:
  prometheus: '{hashed}'
  grafana: '{htpasswd_style}'
"""))
    assert web.tls and web.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert web.ssl_context.minimum_version == ssl.TLSVersion.TLSv1_3
    assert set(web.users) == {"prometheus", "grafana"}
    assert web.headers == {"Strict-Transport-Security": "max-age=31536000"}


def test_tls_section_without_certificate_is_plain_http(tmp_path):
    assert not load_web_config(write(tmp_path, "tls_server_config: {}\n")).tls


@pytest.mark.parametrize(("text", "expected"), [
    ("tls_server_config:\n  cert_file: absent.crt\n  key_file: {key}\n",
     r"web.yml:2: tls_server_config.cert_file: cannot read .*absent.crt: No such file"),
    ("tls_server_config:\n  cert_file: {dir}\n  key_file: {key}\n",
     r"web.yml:2: tls_server_config.cert_file: cannot read .*: a directory, not a regular file"),
    ("tls_server_config:\n  cert_file: {garbage}\n  key_file: {key}\n",
     r"web.yml:2: tls_server_config.cert_file: .*garbage.pem is not a PEM file"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {other_key}\n",
     r"web.yml:3: tls_server_config.key_file: .* are not a matching certificate and private key"),
    ("tls_server_config:\n  cert_file: {cert}\n", r"web.yml:2: tls_server_config.cert_file: "
     "cert_file is set but key_file \\(or key\\) is missing"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  cipher_suites: [X]\n",
     r"web.yml:4: tls_server_config.cipher_suites: unknown cipher suite 'X'; expected Go names"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
     "  cipher_suites: [TLS_RSA_WITH_3DES_EDE_CBC_SHA]\n",
     r"web.yml:4: tls_server_config.cipher_suites: TLS_RSA_WITH_3DES_EDE_CBC_SHA is one of "
     "Go's insecure suites"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
     "  cipher_suites: TLS_AES_128_GCM_SHA256\n",
     r"web.yml:4: tls_server_config.cipher_suites: expected a list of strings"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  max_version: TLS12\n"
     "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
     r"web.yml:5: tls_server_config.cipher_suites: lists only TLS 1.3 suites, but max_version "
     "is below TLS13"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
     "  prefer_server_cipher_suites: 'yes'\n",
     r"web.yml:4: tls_server_config.prefer_server_cipher_suites: expected true or false"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
     "  curve_preferences: [CurveP256, P-384]\n",
     r"web.yml:4: tls_server_config.curve_preferences: unknown curve 'P-384'; expected one of "
     "CurveP256, CurveP384, CurveP521, X25519"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
     "  client_ca_file: {cert}\n",
     r"web.yml:4: tls_server_config.client_ca_file: is set but client_auth_type is "
     "NoClientCert"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  client_ca_file: {cert}\n"
     "  client_auth_type: VerifyClientCertIfGiven\n  client_allowed_sans: [a]\n",
     r"web.yml:6: tls_server_config.client_allowed_sans: needs client_auth_type "
     "RequireAndVerifyClientCert"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  client_ca_file: {cert}\n"
     "  client_auth_type: RequireAndVerifyClientCert\n  client_allowed_sans: [a, 7]\n",
     r"web.yml:6: tls_server_config.client_allowed_sans: expected a list of strings"),
    ("tls_server_config:\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
     r"web.yml:2: tls_server_config.cipher_suites: needs cert_file and key_file"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  cert: x\n",
     r"web.yml:4: tls_server_config.cert: set cert_file or cert, not both"),
    ("tls_server_config:\n  cert_file: {cert}\n  key: not a key\n",
     r"web.yml:3: tls_server_config.key: is not PEM text"),
    ("tls_server_config:\n  key: '-----BEGIN '\n",
     r"web.yml:2: tls_server_config.key: key is set but cert_file \(or cert\) is missing"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  certfile: x\n",
     r"web.yml:4: tls_server_config.certfile: unknown key \(did you mean cert_file\?\)$"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  min_version: TLS9\n",
     r"web.yml:4: tls_server_config.min_version: expected one of TLS10"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  min_version: TLS10\n",
     r"web.yml:4: tls_server_config.min_version: TLS10 cannot be served: .* no cipher suite"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  min_version: TLS11\n",
     r"web.yml:4: tls_server_config.min_version: TLS11 cannot be served: .*use TLS12 or TLS13"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  max_version: TLS11\n",
     r"web.yml:4: tls_server_config.max_version: TLS11 cannot be served"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
     "  client_auth_type: RequireAnyClientCert\n",
     r"web.yml:4: tls_server_config.client_auth_type: .*not supported"),
    ("tls_server_config:\n  client_ca_file: {cert}\n",
     r"web.yml:2: tls_server_config.client_ca_file: needs cert_file and key_file"),
    ("basic_auth_users:\n  admin: hunter2\n",
     r"web.yml:2: basic_auth_users.admin: expected a bcrypt hash"),
    ("basic_auth_users:\n  admin: '$2b$10$short'\n",
     r"web.yml:2: basic_auth_users.admin: expected a bcrypt hash"),
    ("basic_auth_users: [a, b]\n", r"web.yml:1: basic_auth_users: expected a mapping"),
    ("\nbasic_auth_user: {{}}\n", r"web.yml:2: basic_auth_user: unknown key \(did you mean "
     r"basic_auth_users\?\)$"),
    ("\nnonsense: 1\n", r"web.yml:2: nonsense: unknown key \(known keys: "
     r"basic_auth_excluded_paths, basic_auth_users, "),
    ("http_server_config:\n  headers:\n    Server: x\n",
     r"web.yml:3: http_server_config.headers.Server: not one of the settable headers"),
    ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
     r"web.yml:3: http_server_config.headers.X-Frame-Options: expected one of deny, "
     "sameorigin, got 'allow'"),
    ("http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n",
     r"web.yml:3: http_server_config.headers.X-Content-Type-Options: expected one of nosniff"),
    ("http_server_config:\n  headers:\n    X-XSS-Protection: [1]\n",
     r"web.yml:3: http_server_config.headers.X-XSS-Protection: expected a one-line string"),
    ("http_server_config:\n  http2: 'no'\n",
     r"web.yml:2: http_server_config.http2: expected true or false"),
    ("rate_limit:\n  interval: 1x\n", r"web.yml:2: rate_limit.interval: '1x' is not a duration"),
    ("rate_limit:\n  interval: 1\n", r"web.yml:2: rate_limit.interval: expected a duration"),
    ("rate_limit:\n  interval: 1s\n  burst: -1\n",
     r"web.yml:3: rate_limit.burst: expected a whole number, 0 or more"),
    ("rate_limit:\n  interval: 1s\n  bursts: 2\n", r"web.yml:3: rate_limit.bursts: unknown key"),
    ("basic_auth_excluded_paths: [metrics]\n",
     r"web.yml:1: basic_auth_excluded_paths: 'metrics': expected a path starting with /"),
    ("basic_auth_excluded_paths: /metrics\n",
     r"web.yml:1: basic_auth_excluded_paths: expected a list of strings"),
    ("tls_server_config:\n  cert_file: [\n", r"web.yml:3: invalid YAML"),
])
def test_bad_web_config_names_file_line_and_key(tmp_path, certs, text, expected):
    (tmp_path / "garbage.pem").write_text("not a certificate\n")
    (tmp_path / "somedir").mkdir()
    path = write(tmp_path, text.format(cert=certs.server_cert, key=certs.server_key,
                                       other_key=certs.client_key, dir=tmp_path / "somedir",
                                       garbage=tmp_path / "garbage.pem"))
    with pytest.raises(ConfigError, match=expected) as info:
        load_web_config(path)
    assert "\n" not in str(info.value)


def test_missing_web_config_file(tmp_path):
    with pytest.raises(ConfigError, match=r"absent.yml: cannot read: No such file"):
        load_web_config(tmp_path / "absent.yml")


@pytest.mark.parametrize("text", [
    None,  # the file does not exist
    "tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /nonexistent.key\n",
    "basic_auth_users:\n  admin: plaintext\n",
    "tls_server_config: [\n",
    "bogus: 1\n",
])
def test_run_stops_with_one_line_and_exit_2(tmp_path, text):
    path = tmp_path / "web.yml"
    if text is not None:
        path.write_text(text)
    result = subprocess.run([*CLI, "run", "--fake", "--web.listen-address", "127.0.0.1:0",
                             "--web.config.file", str(path)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], result.stderr
    assert lines[0].startswith("cluster-telemetry-exporter: run: ")


def test_check_config_checks_the_web_config_too(tmp_path, certs, hashed):
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {certs.server_cert}\n"
                   f"  key_file: {certs.server_key}\nbasic_auth_users:\n  p: '{hashed}'\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"web_config_file: {web}\n")
    result = subprocess.run([*CLI, "check-config", str(config)], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    assert "TLS, basic auth for 1 user(s)" in result.stdout
    web.write_text("basic_auth_users:\n  p: nope\n")
    result = subprocess.run([*CLI, "check-config", str(config)], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2 and "web.yml:2: basic_auth_users.p" in result.stderr


def tls_copy(tmp_path, certs, key_mode: int):
    for name in ("server.crt", "server.key"):
        (tmp_path / name).write_bytes((certs.ca.parent / name).read_bytes())
    (tmp_path / "server.key").chmod(key_mode)
    return write(tmp_path, "tls_server_config:\n  cert_file: server.crt\n"
                 "  key_file: server.key\n")


@pytest.mark.parametrize("mode, problems", [
    (0o666, ["writable by every user", "readable by every user"]),
    (0o620, ["writable by its group"]),
    (0o604, ["readable by every user"]),
])
def test_a_loose_private_key_is_loaded_with_a_warning(tmp_path, certs, caplog, mode, problems):
    web = load_web_config(tls_copy(tmp_path, certs, mode))
    assert web.tls
    warnings = [r.getMessage() for r in caplog.records if "private key" in r.getMessage()]
    assert len(warnings) == len(problems)
    for warning, problem in zip(warnings, problems, strict=True):
        assert problem in warning and "server.key" in warning and f"{mode:04o}" in warning


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o400])
def test_a_private_key_kept_private_loads_quietly(tmp_path, certs, caplog, mode):
    load_web_config(tls_copy(tmp_path, certs, mode))
    assert not [r for r in caplog.records if "private key" in r.getMessage()]


def test_certificate_expiry_is_known_and_warned_about(tmp_path, certs, caplog, monkeypatch):
    from exporter.web import tlsfiles

    web = load_web_config(tls_copy(tmp_path, certs, 0o600))
    # tests/certs.py makes certificates valid for 2 days: inside the 14-day warning
    assert 0 < web.certificate_not_after - time.time() <= 2 * 86400 + 60
    assert any("expires in" in r.getMessage() for r in caplog.records)
    caplog.clear()
    later = web.certificate_not_after + 3600
    monkeypatch.setattr(tlsfiles.time, "time", lambda: later)
    load_web_config(tmp_path / "web.yml")
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "expired on" in warning and "server.crt" in warning


@pytest.mark.parametrize("auth_type, mode", [("VerifyClientCertIfGiven", ssl.CERT_OPTIONAL),
                                             ("RequireAndVerifyClientCert", ssl.CERT_REQUIRED)])
def test_verifying_without_client_ca_file_trusts_the_system_cas_with_a_warning(
        tmp_path, certs, caplog, auth_type, mode):
    # as Go's crypto/tls does with no ClientCAs: exporter-toolkit's examples rely on it
    web = load_web_config(write(tmp_path, f"tls_server_config:\n  cert_file: {certs.server_cert}"
                                f"\n  key_file: {certs.server_key}\n  client_auth_type: "
                                f"{auth_type}\n"))
    assert web.ssl_context.verify_mode == mode
    (warning,) = [r.getMessage() for r in caplog.records if "client_ca_file" in r.getMessage()]
    assert "web.yml" in warning and auth_type in warning and "every CA" in warning


def test_a_blank_header_is_unset_and_numbers_are_text(tmp_path):
    web = load_web_config(write(tmp_path, "http_server_config:\n  headers:\n"
                                "    X-XSS-Protection: 0\n    Content-Security-Policy: ''\n"))
    assert web.headers == {"X-XSS-Protection": "0"}


def test_go_cipher_names_map_to_openssl_in_order():
    from exporter.web import gotls

    assert gotls.cipher_string(["TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256",
                                "TLS_RSA_WITH_AES_128_CBC_SHA"]) == (
        "ECDHE-RSA-AES256-GCM-SHA384:AES128-SHA")
    assert gotls.cipher_string(["TLS_CHACHA20_POLY1305_SHA256"]) is None
    # every mapped name is one this OpenSSL knows
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.set_ciphers(":".join(gotls.TLS12_SUITES.values()))
    known = {c["name"] for c in context.get_ciphers()}
    assert set(gotls.TLS12_SUITES.values()) <= known


def test_several_curves_go_to_set_groups_where_python_has_it():
    from exporter.web import gotls

    class Context:  # SSLContext.set_groups (CPython 3.15) takes OpenSSL's colon list
        groups = None

        def set_groups(self, groups: str) -> None:
            self.groups = groups

    context = Context()
    gotls.set_curves(context, ["X25519", "CurveP256", "CurveP384"])  # type: ignore[arg-type]
    assert context.groups == "X25519:prime256v1:secp384r1"


def test_one_curve_is_set_and_ml_kem_is_refused_on_openssl_before_3_5():
    from exporter.web import gotls

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    gotls.set_curves(context, ["CurveP384"])
    if ssl.OPENSSL_VERSION_INFO < (3, 5):
        with pytest.raises(gotls.Refused, match=r"X25519MLKEM768: not available in OpenSSL "
                           r".* \(ML-KEM needs OpenSSL 3.5 or later\)"):
            gotls.set_curves(context, ["X25519MLKEM768"])


def test_client_sans_compare_addresses_as_addresses():
    from exporter.web.clientsans import admitted, normalized_sans

    allowed = normalized_sans(["::1", "scraper.example.net", "spiffe://cluster/prometheus"])
    ipv6 = {"subjectAltName": (("IP Address", "0:0:0:0:0:0:0:1"),)}
    uri = {"subjectAltName": (("URI", "spiffe://cluster/prometheus"), ("DNS", "x"))}
    other = {"subjectAltName": (("DNS", "scraper.example.net.evil"), ("email", "::1@x"))}
    assert admitted(ipv6, allowed) and admitted(uri, allowed)
    assert not admitted(other, allowed) and not admitted(None, allowed)
    assert admitted(None, frozenset())  # no allow-list: any verified certificate


def test_certificate_dates_agree_with_openssl(certs):
    from exporter.web.tlsfiles import certificate_dates

    require_module("cryptography")
    out = subprocess.run(["openssl", "x509", "-noout", "-enddate", "-in", str(certs.server_cert)],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    expected = ssl.cert_time_to_seconds(out.strip().split("=", 1)[1])
    not_before, not_after = certificate_dates(str(certs.server_cert))
    assert abs(not_after - expected) < 1 and not_before < not_after


def test_without_cryptography_the_expiry_is_not_exported_and_the_log_says_so(
        tmp_path, certs, caplog, monkeypatch):
    monkeypatch.setitem(sys.modules, "cryptography", None)  # import fails, as if not installed
    monkeypatch.setitem(sys.modules, "cryptography.x509", None)
    web = load_web_config(tls_copy(tmp_path, certs, 0o600))
    assert web.tls and web.certificate_not_after is None
    (warning,) = [r.getMessage() for r in caplog.records if "cryptography" in r.getMessage()]
    assert "cte_tls_certificate_expiry_timestamp_seconds" in warning and "server.crt" in warning


def test_inline_pem_is_served_and_never_written_to_disk(tmp_path, certs, monkeypatch):
    """exporter-toolkit's cert, key and client_ca: the PEM text in the web config."""
    import textwrap

    from exporter.web import pemsource

    opened = []
    real = pemsource.inline_pem

    def spy(text, key, label):
        opened.append(key)
        return real(text, key, label)

    monkeypatch.setattr(pemsource, "inline_pem", spy)  # imported by webconfig when used

    def block(path) -> str:
        return "|\n" + textwrap.indent(path.read_text(), "    ")

    web = load_web_config(write(tmp_path, f"""tls_server_config:
  cert: {block(certs.server_cert)}
  key: {block(certs.server_key)}
  client_ca: {block(certs.ca)}
  client_auth_type: RequireAndVerifyClientCert
"""))
    assert sorted(opened) == ["cert", "client_ca", "key"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["web.yml"]
    assert 0 < web.certificate_not_after - time.time() <= 2 * 86400 + 60
    # the context is the real thing: a client with a certificate from the CA gets through
    import socket
    import threading

    client = ssl.create_default_context(cafile=str(certs.ca))
    client.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def accept():
            conn, _ = listener.accept()
            with web.ssl_context.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"ok")

        thread = threading.Thread(target=accept)
        thread.start()
        with socket.create_connection(listener.getsockname(), timeout=10) as raw, \
                client.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.recv(2) == b"ok"
        thread.join(timeout=10)


def test_inline_mismatched_key_is_named_by_its_key(tmp_path, certs):
    import textwrap

    text = textwrap.indent(certs.client_key.read_text(), "    ")
    path = write(tmp_path, f"tls_server_config:\n  cert_file: {certs.server_cert}\n"
                 f"  key: |\n{text}")
    with pytest.raises(ConfigError, match=r"web.yml:3: tls_server_config.key: .*server.crt and "
                       r".*web.yml: tls_server_config.key are not a matching certificate"):
        load_web_config(path)


@pytest.mark.parametrize(("text", "seconds"), [("0", 0.0), ("1s", 1.0), ("250ms", 0.25),
                                                ("1m30s", 90.0), ("1.5h", 5400.0),
                                                ("100us", 1e-4), ("2h45m", 9900.0)])
def test_go_durations(text, seconds):
    from exporter.web.ratelimit import parse_go_duration

    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1", "s", "1s2", "-1s", "1 s", "1d"])
def test_not_go_durations(text):
    from exporter.web.ratelimit import parse_go_duration

    with pytest.raises(ValueError, match="is not a duration"):
        parse_go_duration(text)


def test_rate_limit_is_off_at_interval_0_and_warns_at_burst_0(tmp_path, caplog):
    assert load_web_config(write(tmp_path, "rate_limit:\n  interval: 0\n")).rate_limit is None
    web = load_web_config(write(tmp_path, "rate_limit:\n  interval: 250ms\n  burst: 0\n"))
    assert web.rate_limit == (0.25, 0)
    assert any("burst 0" in r.getMessage() for r in caplog.records)


def _handshake(server: ssl.SSLContext, version: ssl.TLSVersion) -> str:
    """A TLS handshake in memory between `server` and a client held to `version`: the
    version agreed, or the reason it failed."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    client.minimum_version = client.maximum_version = version
    client.set_ciphers("ALL:@SECLEVEL=0")  # the client offers everything: the server decides
    bios = [ssl.MemoryBIO() for _ in range(4)]
    ends = [server.wrap_bio(bios[0], bios[1], server_side=True), client.wrap_bio(bios[2], bios[3])]
    for _ in range(20):
        done = 0
        for end, out, peer in ((ends[1], bios[3], bios[0]), (ends[0], bios[1], bios[2])):
            try:
                end.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError as exc:
                return f"refused: {exc.reason}"
            peer.write(out.read())
        if done == 2:
            return ends[1].version() or ""
    return "stuck"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # setting TLS 1.0 or 1.1 warns
def test_tls_10_and_11_are_refused_because_no_handshake_could_use_them(certs):
    """What the refusal of min_version TLS10/TLS11 rests on: a server context as the
    exporter builds it, told to allow TLS 1.0 and 1.1, still completes no such handshake
    (should a runtime ever complete one, this fails and the refusal must be revisited)."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.minimum_version = ssl.TLSVersion.TLSv1
    server.load_cert_chain(certs.server_cert, certs.server_key)
    assert _handshake(server, ssl.TLSVersion.TLSv1_2) == "TLSv1.2"  # the harness works
    for legacy in (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1):
        assert _handshake(server, legacy).startswith("refused"), legacy
