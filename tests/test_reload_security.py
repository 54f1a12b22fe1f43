"""A reload never takes TLS or authentication away unless the operator says so.

An empty web config file, `tls_server_config:` alone or `basic_auth_users: {}` are valid
files that ask for nothing: a reload onto one turned TLS and basic auth off. Such a
reload is refused like a broken one (old config kept, one log line, the failure counted),
unless `web_allow_security_downgrade` is set; starting on an empty file stays allowed.
Every check is a real request to the running server after the reload.
"""

from __future__ import annotations

import base64
import http.client
import logging
import ssl
from pathlib import Path

import pytest

from exporter.app import Exporter
from exporter.config import Config
from exporter.service import reload
from exporter.web.downgrade import security_lost
from exporter.web.webconfig import WebConfig
from tests.certs import make_certs
from tests.tools import require_module, wait_for

USER, PASSWORD = "prometheus", "s3cret"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def users_yaml() -> str:
    bcrypt = require_module("bcrypt")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    return f"basic_auth_users:\n  {USER}: '{hashed}'\n"


def tls_yaml(certs, client_auth: str = "") -> str:
    text = (f"tls_server_config:\n  cert_file: {certs.server_cert}\n"
            f"  key_file: {certs.server_key}\n")
    if client_auth:
        text += f"  client_ca_file: {certs.ca}\n  client_auth_type: {client_auth}\n"
    return text


class Served:
    """An exporter started on a web config file, reloaded through a config file naming it."""

    def __init__(self, tmp_path: Path, certs, web_text: str):
        self.certs, self.tmp = certs, tmp_path
        self.web = tmp_path / "web.yml"
        self.web.write_text(web_text)
        self.config = tmp_path / "config.yaml"
        self.exporter = Exporter(Config.of(**self.keys(), log_level="info"))
        self.exporter.start()
        self.write_config()

    def keys(self, **extra) -> dict:
        return {"listen_address": "127.0.0.1:0", "fake": True, "fake_costs": False,
                "collector_host": False, "collector_infiniband": False,
                "web_config_file": str(self.web), **extra}

    def write_config(self, **extra) -> None:
        keys = self.keys(**extra)
        self.config.write_text("".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}\n"
                                       for k, v in keys.items() if v != ""))

    def reload(self, web_text: str | None = None, **extra) -> bool:
        if web_text is not None:
            self.web.write_text(web_text)
        self.write_config(**extra)
        return reload(self.exporter, str(self.config), {})

    def https(self, password: str | None = PASSWORD, client: bool = False) -> int | str:
        context = ssl.create_default_context(cafile=str(self.certs.ca))
        if client:
            context.load_cert_chain(str(self.certs.client_cert), str(self.certs.client_key))
        conn = http.client.HTTPSConnection("127.0.0.1", self.exporter.port, timeout=5,
                                           context=context)
        return _status(conn, password)

    def https_body(self) -> str:
        context = ssl.create_default_context(cafile=str(self.certs.ca))
        conn = http.client.HTTPSConnection("127.0.0.1", self.exporter.port, timeout=5,
                                           context=context)
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        try:
            conn.request("GET", "/metrics", headers={"Authorization": f"Basic {token}"})
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    def plain(self, password: str | None = None) -> int | str:
        return _status(http.client.HTTPConnection("127.0.0.1", self.exporter.port,
                                                  timeout=5), password)

    def failures(self) -> int:
        return self.exporter.reloads.stats().failures_total


def _status(conn: http.client.HTTPConnection, password: str | None) -> int | str:
    headers = {}
    if password is not None:
        token = base64.b64encode(f"{USER}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    try:
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__
    finally:
        conn.close()


@pytest.fixture
def served(tmp_path, certs):
    made: list[Served] = []

    def start(web_text: str) -> Served:
        made.append(Served(tmp_path, certs, web_text))
        return made[-1]

    yield start
    for s in made:
        s.exporter.stop()
    logging.getLogger().setLevel(logging.WARNING)


def refused_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "reload refused" in r.getMessage()]


@pytest.mark.parametrize("web_text, lost", [
    ("", "TLS and basic auth"),
    ("tls_server_config:\n", "TLS and basic auth"),
    ("basic_auth_users: {}\n", "TLS and basic auth"),
    (None, "basic auth"),  # TLS kept, basic_auth_users: {}
], ids=["empty file", "tls_server_config alone", "basic_auth_users {}", "auth only"])
def test_a_reload_that_takes_tls_or_auth_away_is_refused(served, certs, users_yaml, caplog,
                                                          web_text, lost):
    s = served(tls_yaml(certs) + users_yaml)
    assert (s.https(), s.https(password=None)) == (200, 401)
    if web_text is None:
        web_text = tls_yaml(certs) + "basic_auth_users: {}\n"
    with caplog.at_level(logging.INFO):
        assert not s.reload(web_text)
    (line,) = refused_lines(caplog)
    assert f"would take away {lost}, which the server has" in line
    assert "web_allow_security_downgrade" in line and str(s.web) in line
    assert s.failures() == 1
    # the old config serves: TLS and the password, as before
    assert (s.https(), s.https(password=None), s.https(password="wrong")) == (200, 401, 401)
    assert s.plain() != 200


def test_unsetting_the_web_config_file_is_refused_too(served, certs, users_yaml, caplog):
    s = served(tls_yaml(certs) + users_yaml)
    with caplog.at_level(logging.ERROR):
        assert not s.reload(web_config_file="")
    (line,) = refused_lines(caplog)
    assert "web config (none) would take away TLS and basic auth" in line
    assert s.https() == 200 and s.plain() != 200
    wait_for(lambda: 'cte_config_reloads_total{result="failure"} 1.0' in s.https_body(),
             timeout=10)
    assert "cte_config_last_reload_successful 0.0" in s.https_body()


def test_dropping_client_certificates_is_refused(served, certs, caplog):
    s = served(tls_yaml(certs, "RequireAndVerifyClientCert"))
    assert s.https(client=True) == 200
    assert s.https(client=False) != 200  # the handshake fails without one
    with caplog.at_level(logging.ERROR):
        assert not s.reload(tls_yaml(certs))  # no client_auth_type: NoClientCert
    (line,) = refused_lines(caplog)
    assert ("client certificates (client_auth_type RequireAndVerifyClientCert to "
            "NoClientCert)") in line
    assert s.https(client=False) != 200 and s.https(client=True) == 200


def test_the_setting_allows_a_downgrade_and_says_so(served, certs, users_yaml, caplog):
    s = served(tls_yaml(certs) + users_yaml)
    with caplog.at_level(logging.INFO):
        assert s.reload("", web_allow_security_downgrade=True)
    assert not refused_lines(caplog)
    (warning,) = [r for r in caplog.records if "takes away" in r.getMessage()]
    assert warning.levelno == logging.WARNING and "TLS and basic auth" in warning.getMessage()
    assert s.plain() == 200  # plain HTTP, no password: what the operator asked for
    assert s.failures() == 0


def test_adding_security_or_rotating_it_still_applies(served, certs, users_yaml):
    s = served("")  # starting on an empty file is allowed: plain HTTP, no password
    assert s.plain() == 200
    assert s.reload(tls_yaml(certs) + users_yaml)
    assert (s.https(), s.https(password=None)) == (200, 401)
    assert s.reload(tls_yaml(certs, "VerifyClientCertIfGiven") + users_yaml)  # stricter
    assert s.https(client=True) == 200
    assert s.failures() == 0


def _web(verify=None, users=False, excluded=(), sans=()) -> WebConfig:
    context = None
    if verify is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.verify_mode = verify
    return WebConfig("web.yml", context, {USER: b"$2b$04$x"} if users else {},
                     allowed_sans=frozenset(sans), auth_excluded_paths=frozenset(excluded))


@pytest.mark.parametrize("running, new, lost", [
    (_web(ssl.CERT_NONE, users=True), _web(ssl.CERT_NONE, users=True), []),
    (_web(), _web(ssl.CERT_REQUIRED, users=True), []),  # more is always allowed
    (_web(ssl.CERT_NONE, users=True), _web(users=True), ["TLS"]),
    (_web(users=True), _web(users=True, excluded=["/metrics"]),
     ["basic auth for /metrics (basic_auth_excluded_paths)"]),
    (_web(users=True, excluded=["/metrics"]), _web(users=True), []),
    (_web(ssl.CERT_REQUIRED), _web(ssl.CERT_OPTIONAL),
     ["client certificates (client_auth_type RequireAndVerifyClientCert to "
      "VerifyClientCertIfGiven)"]),
    (_web(ssl.CERT_REQUIRED, sans=["prom"]), _web(ssl.CERT_REQUIRED),
     ["the client SAN allow-list (client_allowed_sans)"]),
    (_web(ssl.CERT_REQUIRED, sans=["prom"]), _web(ssl.CERT_REQUIRED, sans=["other"]), []),
])
def test_what_a_new_web_config_would_take_away(running, new, lost):
    assert security_lost(running, new) == lost
