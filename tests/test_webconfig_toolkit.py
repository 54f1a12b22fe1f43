"""exporter-toolkit's own example web configs (tests/data/exporter-toolkit), unchanged:
each passes check-config and the server serves with it as configured (TLS versions,
cipher suites and who picks among them, curves, ALPN, headers, client SAN allow-list,
basic auth, paths excluded from it)."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.web.webconfig import load_web_config
from tests.certs import leaf, make_certs
from tests.tools import get_over_new_connection, require_module

CLI = [sys.executable, "-m", "exporter"]
EXAMPLES = Path(__file__).parent / "data" / "exporter-toolkit"
ACCEPTED = ["web-config.yml", "web_config_noAuth_someCiphers.good.yml",
            "web_config_noAuth_allCiphers.good.yml",
            "web_config_noAuth_someCiphers_noOrder.good.yml",
            "web_config_noAuth_someCurves.good.yml", "web_config_noAuth_noHTTP2.good.yml",
            "web_config_auth_client_san.good.yaml", "web_config_headers.good.yml",
            "web_config_users.good.yml", "web_config_rate_limiter_one_second.yaml"]
# Several curves need SSLContext.set_groups, which this Python may lack.
SEVERAL_CURVES = "web_config_noAuth_allCurves.good.yml"
SERVER_EXT = ("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n")
CLIENT_EXT = "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    # Go's examples use RSA suites (TLS_ECDHE_RSA_*): an RSA server certificate
    server = leaf(certs, "rsa-server", SERVER_EXT, rsa=True)
    allowed = leaf(certs, "client-test3", CLIENT_EXT + "subjectAltName=DNS:test3\n")
    refused = leaf(certs, "client-other", CLIENT_EXT + "subjectAltName=DNS:other,IP:127.0.0.1\n")
    return certs, server, allowed, refused


def example(name: str, directory: Path, certs) -> Path:
    """The example copied byte for byte, beside the certificate files it names."""
    ca, (server_crt, server_key), _, _ = certs[0].ca, *certs[1:]
    shutil.copy(EXAMPLES / name, directory / name)
    shutil.copy(server_crt, directory / "server.crt")
    shutil.copy(server_key, directory / "server.key")
    (directory / "server.key").chmod(0o600)
    shutil.copy(ca, directory / "client2_selfsigned.pem")
    assert (directory / name).read_bytes() == (EXAMPLES / name).read_bytes()
    return directory / name


def check_config(tmp_path: Path, web: Path) -> subprocess.CompletedProcess:
    config = tmp_path / "config.yaml"
    config.write_text(f"web_config_file: {web}\n")
    return subprocess.run([*CLI, "check-config", str(config)], capture_output=True, text=True,
                          timeout=60)


def test_the_examples_are_the_toolkits_and_say_so():
    readme = (EXAMPLES / "README.md").read_text()
    assert "github.com/prometheus/exporter-toolkit" in readme and "Apache" in readme
    names = {p.name for p in EXAMPLES.iterdir() if p.suffix in (".yml", ".yaml")}
    assert names == {*ACCEPTED, SEVERAL_CURVES}


@pytest.mark.parametrize("name", ACCEPTED)
def test_each_example_passes_check_config(tmp_path, certs, name):
    result = check_config(tmp_path, example(name, tmp_path, certs))
    assert result.returncode == 0, result.stderr
    assert ": ok (" in result.stdout


@pytest.mark.skipif(hasattr(ssl.SSLContext, "set_groups"), reason="this Python sets several")
def test_several_curves_are_refused_with_one_line_saying_why(tmp_path, certs):
    result = check_config(tmp_path, example(SEVERAL_CURVES, tmp_path, certs))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert f"{SEVERAL_CURVES}:5: tls_server_config.curve_preferences: " in line
    assert "one curve only" in line and "SSLContext.set_groups" in line


# -- serving ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exporter(module_exporter):
    return module_exporter.start(manual=True)


@pytest.fixture
def serve(exporter, certs, tmp_path):
    """serve(name, edit=None): the exporter serves new connections with this example."""
    def serve(name: str, edit=None):
        path = example(name, tmp_path, certs)
        if edit is not None:
            path.write_text(edit(path.read_text()))
        exporter.apply_web_config(load_web_config(path))
        return exporter.port

    yield serve
    exporter.apply_web_config(load_web_config(None))


def client(certs, version: ssl.TLSVersion | None = None, ciphers: str | None = None,
           curve: str | None = None, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs[0].ca))
    if version is not None:
        context.minimum_version = context.maximum_version = version
    if ciphers is not None:
        context.set_ciphers(ciphers)
    if curve is not None:
        context.set_ecdh_curve(curve)
    if cert is not None:
        context.load_cert_chain(*map(str, cert))
    return context


def handshake(port: int, context: ssl.SSLContext, alpn: list[str] | None = None):
    """(TLS version, cipher, ALPN protocol) the server agreed to; raises if it refused."""
    import socket

    if alpn:
        context.set_alpn_protocols(alpn)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return tls.version(), tls.cipher()[0], tls.selected_alpn_protocol()


REFUSED = (ssl.SSLError, ConnectionError, OSError)
TLS12, TLS13 = ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3


def test_some_ciphers_serves_only_those_in_the_servers_order(serve, certs):
    port = serve("web_config_noAuth_someCiphers.good.yml")
    # the client prefers AES-256; the server's order (prefer_server_cipher_suites: true,
    # the default) puts AES-128 first and wins
    offer = "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-AES128-GCM-SHA256"
    assert handshake(port, client(certs, TLS12, offer)) == (
        "TLSv1.2", "ECDHE-RSA-AES128-GCM-SHA256", None)
    with pytest.raises(REFUSED):  # a suite not in the list
        handshake(port, client(certs, TLS12, "ECDHE-RSA-CHACHA20-POLY1305"))
    with pytest.raises(REFUSED):  # max_version: TLS12
        handshake(port, client(certs, TLS13))
    status, body = get_over_new_connection(port, client(certs))
    assert status == 200 and b"gpu_power_watts" in body


def test_prefer_server_cipher_suites_false_lets_the_client_pick(serve, certs):
    name = "web_config_noAuth_someCiphers_noOrder.good.yml"
    offer = "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384"
    port = serve(name)  # server order AES-256, AES-128; prefer_server_cipher_suites: false
    assert handshake(port, client(certs, TLS12, offer))[1] == "ECDHE-RSA-AES128-GCM-SHA256"
    port = serve(name, lambda text: text.replace("prefer_server_cipher_suites: false",
                                                 "prefer_server_cipher_suites: true"))
    assert handshake(port, client(certs, TLS12, offer))[1] == "ECDHE-RSA-AES256-GCM-SHA384"


@pytest.mark.parametrize(("offer", "version"), [
    ("AES128-SHA", TLS12),  # TLS_RSA_WITH_AES_128_CBC_SHA
    ("AES256-GCM-SHA384", TLS12),  # TLS_RSA_WITH_AES_256_GCM_SHA384
    ("ECDHE-RSA-AES256-SHA", TLS12),  # TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA
    ("ECDHE-RSA-CHACHA20-POLY1305", TLS12),
    (None, TLS13),  # TLS 1.3 suites: listed, and as in Go not configurable
])
def test_all_ciphers_serves_each_go_suite(serve, certs, offer, version):
    port = serve("web_config_noAuth_allCiphers.good.yml")
    negotiated_version, cipher, _ = handshake(port, client(certs, version, offer))
    assert negotiated_version == ("TLSv1.2" if version == TLS12 else "TLSv1.3")
    assert offer is None or cipher == offer


def test_all_ciphers_leaves_out_suites_go_does_not_list(serve, certs):
    port = serve("web_config_noAuth_allCiphers.good.yml")
    with pytest.raises(REFUSED):  # TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256: not in the list
        handshake(port, client(certs, TLS12, "ECDHE-RSA-AES128-SHA256"))


def test_one_curve_is_the_only_key_exchange_served(serve, certs):
    port = serve("web_config_noAuth_someCurves.good.yml")  # TLS13, CurveP521
    assert handshake(port, client(certs, curve="secp521r1"))[0] == "TLSv1.3"
    for other in ("prime256v1", "X25519", "secp384r1"):
        with pytest.raises(REFUSED):
            handshake(port, client(certs, curve=other))
    with pytest.raises(REFUSED):  # min_version: TLS13
        handshake(port, client(certs, TLS12))


def test_no_http2_example_speaks_http_1_1(serve, certs):
    port = serve("web_config_noAuth_noHTTP2.good.yml")
    version, cipher, alpn = handshake(port, client(certs), alpn=["h2", "http/1.1"])
    assert (version, cipher, alpn) == ("TLSv1.2", "ECDHE-RSA-AES256-GCM-SHA384", "http/1.1")


def test_client_allowed_sans_admits_only_listed_names(serve, certs):
    _, _, allowed, refused = certs
    port = serve("web_config_auth_client_san.good.yaml")
    status, body = get_over_new_connection(port, client(certs, cert=allowed))
    assert status == 200 and b"gpu_power_watts" in body
    for cert in (refused, None):  # a SAN not listed; no certificate at all
        with pytest.raises(REFUSED):
            get_over_new_connection(port, client(certs, cert=cert))


def test_headers_example_sets_every_header(serve, exporter):
    import http.client

    port = serve("web_config_headers.good.yml")  # no TLS section: plain HTTP
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        for path in ("/metrics", "/healthz"):
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200
            assert resp.getheader("X-Frame-Options") == "deny"
            assert resp.getheader("Strict-Transport-Security") == (
                "max-age=31536000; includeSubDomains")
            assert resp.getheader("X-Content-Type-Options") == "nosniff"
            assert resp.getheader("X-XSS-Protection") == "1"
            assert resp.getheader("Content-Security-Policy") == (
                "default-src 'self' *.test.example.net")
    finally:
        conn.close()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_users_example_checks_its_bcrypt_hashes(serve, certs):
    require_module("bcrypt")
    port = serve("web_config_users.good.yml")
    # carol's and dave's hashes are of carol123 and dave123 (cost 10)
    status, body = get_over_new_connection(port, client(certs), basic("carol", "carol123"))
    assert status == 200 and b"gpu_power_watts" in body
    assert get_over_new_connection(port, client(certs), basic("dave", "dave123"))[0] == 200
    for headers in (basic("carol", "dave123"), basic("mallory", "carol123"), None):
        status, body = get_over_new_connection(port, client(certs), headers)
        assert status == 401 and b"gpu_" not in body


def test_documented_sample_excludes_its_paths_from_basic_auth(serve, certs):
    require_module("bcrypt")
    port = serve("web-config.yml")
    assert get_over_new_connection(port, client(certs), path="/metrics")[0] == 401
    assert get_over_new_connection(port, client(certs), path="/")[0] == 401
    # excluded: answered without credentials (we serve nothing there: 404, not 401)
    for path in ("/-/healthy", "/-/ready"):
        assert get_over_new_connection(port, client(certs), path=path)[0] == 404


def test_rate_limiter_example_with_burst_0_refuses_all_but_probes(serve, certs):
    port = serve("web_config_rate_limiter_one_second.yaml")  # burst 0: Go's limiter refuses all
    for path in ("/metrics", "/", "/api/v1/power"):
        assert get_over_new_connection(port, path=path)[0] == 429
    assert get_over_new_connection(port, path="/healthz")[0] == 200


def test_rate_limit_allows_the_burst_then_answers_429(serve, certs):
    port = serve("web_config_rate_limiter_one_second.yaml",
                 lambda text: text.replace('"1s"', '"1h"').replace("burst: 0", "burst: 2"))
    statuses = [get_over_new_connection(port)[0] for _ in range(4)]
    assert statuses == [200, 200, 429, 429]


def test_prometheus_scrapes_only_with_an_allowed_client_certificate(serve, certs, tmp_path):
    """A Go TLS client (Prometheus) against the SAN allow-list, on an RSA certificate."""
    from tests.prom import Prometheus
    from tests.tools import wait_for

    ca, _, allowed, refused = certs[0].ca, *certs[1:]
    port = serve("web_config_auth_client_san.good.yaml")
    target = [{"targets": [f"127.0.0.1:{port}"]}]

    def job(name: str, cert: tuple[Path, Path]) -> dict:
        tls = {"ca_file": str(ca), "cert_file": str(cert[0]), "key_file": str(cert[1])}
        return {"job_name": name, "scheme": "https", "tls_config": tls, "static_configs": target}

    (tmp_path / "prom").mkdir()
    prom = Prometheus(tmp_path / "prom", [], scrape_configs=[job("test3", allowed),
                                                               job("other", refused)])
    try:
        def up_by_job():
            ups = {r["metric"]["job"]: r["value"][1] for r in prom.query("up")}
            return ups if len(ups) == 2 else None

        assert wait_for(up_by_job, timeout=30, interval=0.5) == {"test3": "1", "other": "0"}
        power = prom.query('count(gpu_power_watts{job="test3"})')
        assert power and power[0]["value"][1] == "8"
    finally:
        prom.stop()
