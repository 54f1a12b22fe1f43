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
     "cert_file is set but key_file is missing"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  cipher_suites: [X]\n",
     r"web.yml:4: tls_server_config.cipher_suites: not supported"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  certfile: x\n",
     r"web.yml:4: tls_server_config.certfile: unknown key"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  min_version: TLS9\n",
     r"web.yml:4: tls_server_config.min_version: expected one of TLS10"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  min_version: TLS10\n",
     r"web.yml:4: tls_server_config.min_version: TLS10 cannot be served: .* no cipher suite"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  min_version: TLS11\n",
     r"web.yml:4: tls_server_config.min_version: TLS11 cannot be served: .*use TLS12 or TLS13"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  max_version: TLS11\n",
     r"web.yml:4: tls_server_config.max_version: TLS11 cannot be served"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
     "  client_auth_type: RequireAndVerifyClientCert\n",
     r"web.yml:4: tls_server_config.client_auth_type: RequireAndVerifyClientCert needs "
     "client_ca_file"),
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
    ("\nbasic_auth_user: {{}}\n", r"web.yml:2: basic_auth_user: unknown key"),
    ("http_server_config:\n  headers:\n    Server: x\n",
     r"web.yml:3: http_server_config.headers.Server: not one of the settable headers"),
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
    assert lines[0].startswith("cluster-telemetry-exporter: error: ")


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
