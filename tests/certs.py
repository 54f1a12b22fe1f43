"""A throwaway CA, server and client certificates for TLS tests (openssl CLI)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.tools import require_binary

_CA_EXT = ["-addext", "basicConstraints=critical,CA:TRUE",
           "-addext", "keyUsage=critical,keyCertSign,cRLSign"]


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing we trust
    other_client_cert: Path
    other_client_key: Path


def _run(*args: str, cwd: Path) -> None:
    subprocess.run([require_binary("openssl"), *args], cwd=cwd, check=True,
                   capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> None:
    _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
         *_CA_EXT, cwd=directory)


def _leaf(directory: Path, name: str, ca: str, extensions: str, rsa: bool = False) -> None:
    (directory / f"{name}.ext").write_text(extensions)
    key = ["rsa:2048"] if rsa else ["ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    _run("req", "-newkey", *key, "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
         "-subj", f"/CN={name}", cwd=directory)
    _run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
         "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
         cwd=directory)


def make_certs(directory: Path) -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    _ca(directory, "ca")
    _ca(directory, "other-ca")
    _leaf(directory, "server", "ca", "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
          "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _leaf(directory, "client", "ca", "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
          "extendedKeyUsage=clientAuth\n")
    _leaf(directory, "stranger", "other-ca", "basicConstraints=CA:FALSE\n"
          "keyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n")
    d = directory
    return Certs(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt",
                 d / "client.key", d / "other-ca.crt", d / "stranger.crt", d / "stranger.key")


def server_cert(certs: Certs, name: str) -> tuple[Path, Path]:
    """Another server certificate and key for 127.0.0.1 from the same CA (a renewal)."""
    _leaf(certs.ca.parent, name, "ca", "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
          "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n")
    return certs.ca.parent / f"{name}.crt", certs.ca.parent / f"{name}.key"


def leaf(certs: Certs, name: str, extensions: str, rsa: bool = False) -> tuple[Path, Path]:
    """Another certificate and key signed by the test CA, with these x509v3 extensions."""
    _leaf(certs.ca.parent, name, "ca", extensions, rsa)
    return certs.ca.parent / f"{name}.crt", certs.ca.parent / f"{name}.key"
