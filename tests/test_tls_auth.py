"""TLS, client certificates and basic auth, end to end: a real Prometheus scrapes over TLS."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import time

import pytest

from tests.certs import make_certs
from tests.prom import Prometheus
from tests.tools import require_module, wait_for

USER, PASSWORD = "prometheus", "correct horse battery staple"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def exporter(tmp_path_factory, certs, module_exporter):
    bcrypt = require_module("bcrypt")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    web = tmp_path_factory.mktemp("web") / "web.yml"
    web.write_text(f"""
tls_server_config:
  cert_file: {certs.server_cert}
  key_file: {certs.server_key}
  client_ca_file: {certs.ca}
  client_auth_type: RequireAndVerifyClientCert
  min_version: TLS12
http_server_config:
  headers:
    X-Content-Type-Options: nosniff
basic_auth_users:
  {USER}: '{hashed}'
""")
    return module_exporter.start(web_config_file=str(web))


def client_context(certs, cert=None, key=None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    if cert:
        context.load_cert_chain(str(cert), str(key))
    return context


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def get(exporter, certs, path="/metrics", headers=None, cert="client"):
    files = {"client": (certs.client_cert, certs.client_key),
             "stranger": (certs.other_client_cert, certs.other_client_key), None: (None, None)}
    context = client_context(certs, *files[cert])
    conn = http.client.HTTPSConnection("127.0.0.1", exporter.port, context=context, timeout=5)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp, resp.read()
    finally:
        conn.close()


def test_scrape_with_password_and_client_certificate(exporter, certs):
    resp, body = get(exporter, certs, headers=basic(USER, PASSWORD))
    assert resp.status == 200 and b"gpu_power_watts" in body
    # tests/certs.py certificates are valid for 2 days: the expiry is exported
    line = next(x for x in body.split(b"\n")
                if x.startswith(b"cte_tls_certificate_expiry_timestamp_seconds "))
    assert 0 < float(line.split()[1]) - time.time() <= 2 * 86400 + 60
    assert resp.getheader("X-Content-Type-Options") == "nosniff"


def test_successful_checks_are_cached_so_scrapes_stay_cheap(exporter, certs):
    auth = exporter.server.auth
    get(exporter, certs, headers=basic(USER, PASSWORD))
    before = auth.bcrypt_checks
    context = client_context(certs, certs.client_cert, certs.client_key)
    conn = http.client.HTTPSConnection("127.0.0.1", exporter.port, context=context, timeout=5)
    for _ in range(20):  # one keep-alive connection, as Prometheus scrapes
        conn.request("GET", "/metrics", headers=basic(USER, PASSWORD))
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
    conn.close()
    # no bcrypt work per scrape (a cost-10 check takes ~60 ms of CPU): counted, not timed
    assert auth.bcrypt_checks == before


@pytest.mark.parametrize("headers", [
    {}, basic(USER, "wrong"), basic("nobody", PASSWORD), {"Authorization": "Basic !!!"},
    {"Authorization": "Bearer x"}, basic(USER, PASSWORD + "x" * 100),
])
def test_wrong_or_missing_password_is_refused(exporter, certs, headers):
    resp, body = get(exporter, certs, headers=headers)
    assert resp.status == 401 and b"gpu_" not in body
    assert resp.getheader("WWW-Authenticate") == 'Basic realm="cluster-telemetry-exporter"'


def test_landing_page_needs_auth_and_healthz_does_not(exporter, certs):
    assert get(exporter, certs, "/")[0].status == 401
    resp, body = get(exporter, certs, "/healthz")  # kubelet probes carry no password
    assert (resp.status, body) == (200, b"ok\n")
    resp, body = get(exporter, certs, "/readyz")
    assert resp.status == 200 and body.split(b"\n")[0] in (b"ok", b"degraded")
    assert b"- " not in body  # details only with credentials


@pytest.mark.parametrize("cert", [None, "stranger"])
def test_client_without_a_trusted_certificate_is_refused(exporter, certs, cert):
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)):
        get(exporter, certs, headers=basic(USER, PASSWORD), cert=cert)


def test_plain_http_is_refused(exporter):
    with socket.create_connection(("127.0.0.1", exporter.port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.0 400 Bad Request")
    assert b"HTTPS server" in data and b"gpu_" not in data


def test_prometheus_scrapes_over_tls_with_basic_auth(exporter, certs, tmp_path):
    target = [{"targets": [f"127.0.0.1:{exporter.port}"]}]
    tls = {"ca_file": str(certs.ca), "cert_file": str(certs.client_cert),
           "key_file": str(certs.client_key)}
    jobs = [
        {"job_name": "good", "scheme": "https", "tls_config": tls,
         "basic_auth": {"username": USER, "password": PASSWORD}, "static_configs": target},
        {"job_name": "wrong-password", "scheme": "https", "tls_config": tls,
         "basic_auth": {"username": USER, "password": "guess"}, "static_configs": target},
        {"job_name": "no-password", "scheme": "https", "tls_config": tls,
         "static_configs": target},
        {"job_name": "plain-http", "static_configs": target},
    ]
    prom = Prometheus(tmp_path, [], scrape_configs=jobs)
    try:
        def up_by_job():
            ups = {r["metric"]["job"]: r["value"][1] for r in prom.query("up")}
            return ups if len(ups) == len(jobs) else None

        ups = wait_for(up_by_job, timeout=30, interval=0.5)
        assert ups == {"good": "1", "wrong-password": "0", "no-password": "0", "plain-http": "0"}
        power = prom.query('count(gpu_power_watts{job="good"})')
        assert power and power[0]["value"][1] == "8"
        errors = {t["labels"]["job"]: t["lastError"]
                  for t in prom.api("targets")["activeTargets"]}
        assert "401" in errors["wrong-password"] and "401" in errors["no-password"]
        assert "400" in errors["plain-http"]
    finally:
        prom.stop()


def test_a_password_of_exactly_72_bytes_needs_every_byte_and_nothing_more():
    """bcrypt reads 72 bytes; a longer password is refused, never cut to the 72 it matches."""
    bcrypt = require_module("bcrypt")
    from exporter.web.auth import BasicAuth, Verdict

    password = "é" * 30 + "x" * 12  # 72 bytes in UTF-8, 42 characters
    assert len(password.encode()) == 72
    auth = BasicAuth({USER: bcrypt.hashpw(password.encode(), bcrypt.gensalt(4))})
    assert auth.check(basic(USER, password)["Authorization"]) is Verdict.OK
    for other in (password + "x", password + "any suffix at all", password[:-1],
                  password[:-1] + "y"):
        assert auth.check(basic(USER, other)["Authorization"]) is Verdict.DENIED, other
    assert auth.check(basic(USER, password)["Authorization"]) is Verdict.OK  # still cached
