"""Where a web config's PEM comes from: a file it names (cert_file), or the PEM text
itself (cert, key, client_ca: exporter-toolkit's inline keys).

OpenSSL loads a certificate chain only from a path, so inline PEM is handed to it
through an anonymous in-memory file (memfd_create, Linux): an inline private key never
touches a disk, and the file is gone when the load is done.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Pem:
    path: str  # what OpenSSL opens
    key: str  # the config key it came from (cert_file, cert, ...)
    label: str  # what messages call it: the file, or "<web.yml>: tls_server_config.cert"

    @property
    def inline(self) -> bool:
        return not self.key.endswith("_file")


@contextmanager
def inline_pem(text: str, key: str, label: str) -> Iterator[Pem]:
    """The PEM text as a path OpenSSL can open, for the duration of the block."""
    fd = os.memfd_create("cte-web-config-pem", os.MFD_CLOEXEC)
    try:
        with open(fd, "wb", closefd=False) as file:
            file.write(text.encode())
        yield Pem(f"/proc/self/fd/{fd}", key, label)
    finally:
        os.close(fd)
