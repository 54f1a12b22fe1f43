"""The live page's static files, served from memory under /static/NAME.

Only the names in ASSETS exist: a request names a key of this table, never a path, so
there is nothing to traverse. Each file is read from the package once, with its gzip and
an ETag (a hash of its bytes); the page links them as /static/NAME?v=ETAG, so a browser
may keep them for a day and still gets the new file right after an upgrade.
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from importlib import resources

PREFIX = "/static/"
ASSETS = {
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "uPlot.LICENSE": "text/plain; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
}
# private: behind basic auth, no shared cache should keep a copy
CACHE_CONTROL = "private, max-age=86400"


@dataclass(frozen=True)
class Asset:
    name: str
    content_type: str
    body: bytes
    gzipped: bytes
    etag: str  # quoted, as the header carries it

    @property
    def version(self) -> str:
        return self.etag.strip('"')[:12]


_cache: dict[str, Asset] = {}
_lock = threading.Lock()


def asset(name: str) -> Asset | None:
    """The named file (loaded on first use), or None for any name not in ASSETS."""
    content_type = ASSETS.get(name)
    if content_type is None:
        return None
    with _lock:
        found = _cache.get(name)
        if found is None:
            import hashlib  # OpenSSL's libcrypto (~3.5 MiB): when the page is first asked for

            body = resources.files("exporter.web").joinpath("static", name).read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
            found = Asset(name, content_type, body,
                          gzip.compress(body, compresslevel=9, mtime=0), etag)
            _cache[name] = found
        return found


def url(name: str) -> str:
    """/static/NAME?v=VERSION: a new file gets a new URL, so caches never serve an old one."""
    found = asset(name)
    assert found is not None, name
    return f"{PREFIX}{name}?v={found.version}"


def not_modified(found: Asset, if_none_match: str | None) -> bool:
    """Whether an If-None-Match header names this file's current version."""
    if not if_none_match:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in if_none_match.split(",")[:16]]
    return found.etag in tags or "*" in tags
