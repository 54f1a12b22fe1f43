"""HTTP basic auth against bcrypt hashes, with a cache of successful checks.

A bcrypt check costs tens of milliseconds of CPU by design (about 60 ms at cost
10 here), far more than serving a scrape from cached bytes. Like exporter-toolkit,
we remember a password that verified: the cache holds a keyed SHA-256 of
(user, password) under a random per-process key, and a scrape with a known
password costs one HMAC and one constant-time compare. Failed checks are never
cached. At most `max_concurrent_checks` bcrypt checks run at once; a request that
cannot get one within `wait_seconds` is answered 429, so a flood of wrong
passwords costs at most that many cores and never holds the request slots that
scrapes need.
"""

from __future__ import annotations

import base64
import binascii
import enum
import os
import threading


class Verdict(enum.Enum):
    OK = "ok"
    DENIED = "denied"
    BUSY = "busy"  # too many bcrypt checks in flight; try again


class BasicAuth:
    def __init__(self, users: dict[str, bytes], max_concurrent_checks: int = 2,
                 wait_seconds: float = 0.25, cache_size: int = 256):
        import hmac  # OpenSSL's libcrypto (~3.5 MiB): loaded by an exporter with users only

        import bcrypt

        self._bcrypt = bcrypt
        self._hmac = hmac
        self.users = dict(users)
        self._key = os.urandom(32)
        self._cache: dict[str, bytes] = {}  # user -> keyed digest of the password that verified
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._gate = threading.BoundedSemaphore(max_concurrent_checks)
        self._wait = wait_seconds
        # Unknown users are checked against this, so they cost what known users cost.
        self._dummy = bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(_cost(users)))
        self.bcrypt_checks = 0

    def check(self, authorization: str | None) -> Verdict:
        credentials = parse_basic(authorization)
        if credentials is None:
            return Verdict.DENIED
        user, password = credentials
        digest = self._hmac.new(self._key, user.encode() + b"\0" + password, "sha256").digest()
        with self._lock:
            cached = self._cache.get(user, b"\0" * len(digest))
        if self._hmac.compare_digest(cached, digest):
            return Verdict.OK
        if not self._gate.acquire(timeout=self._wait):
            return Verdict.BUSY
        try:
            self.bcrypt_checks += 1
            ok = self._bcrypt_ok(password, self.users.get(user))
        finally:
            self._gate.release()
        if not ok:
            return Verdict.DENIED
        with self._lock:
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
            self._cache[user] = digest
        return Verdict.OK

    def _bcrypt_ok(self, password: bytes, hashed: bytes | None) -> bool:
        try:
            matched = self._bcrypt.checkpw(password, hashed or self._dummy)
        except ValueError:  # over 72 bytes, or a hash bcrypt cannot read
            return False
        return matched and hashed is not None


def parse_basic(authorization: str | None) -> tuple[str, bytes] | None:
    """'Basic base64(user:password)' -> (user, password); None if absent or malformed."""
    if not authorization:
        return None
    scheme, _, encoded = authorization.strip().partition(" ")
    if scheme.lower() != "basic" or not encoded or len(encoded) > 1024:
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


def _cost(users: dict[str, bytes]) -> int:
    for hashed in users.values():
        return int(hashed[4:6])
    return 10
