"""Signed links: a URL that opens one path of the API for a short while without the bearer token.

A browser's `<video src>` and `<track src>` cannot send an Authorization header, so with a token
configured the page had to download a whole clip before it could play it. The API signs a clip's
media paths instead: `path?exp=<epoch s>&sig=<HMAC-SHA256 of path and exp>`. The key is random per
process (a link works on the worker that made it, until it restarts), a link opens exactly the
path it was made for, only for GET, and only until `exp` (at most `TTL_S` ahead). Without a token
nothing needs signing and the links are the plain paths.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping

TTL_S = 3600  # a clip opened on the page plays (and seeks) this long


class UrlSigner:
    def __init__(self, key: bytes | None = None, *, ttl_s: int = TTL_S) -> None:
        self._key = key or secrets.token_bytes(32)
        self.ttl_s = ttl_s

    def sign(self, path: str, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + self.ttl_s)
        return f"{path}?exp={expires}&sig={self._mac(path, expires)}"

    def valid(self, path: str, query: Mapping[str, str], now: float | None = None) -> bool:
        """Whether `query` carries a signature of `path` that has not expired."""
        raw, sig = query.get("exp", ""), query.get("sig", "")
        if not raw.isdigit() or len(raw) > 12 or not sig:
            return False
        expires = int(raw)
        now = time.time() if now is None else now
        if not now <= expires <= now + self.ttl_s:
            return False
        return hmac.compare_digest(sig.encode("ascii", "replace"), self._mac(path, expires).encode("ascii"))

    def _mac(self, path: str, expires: int) -> str:
        digest = hmac.new(self._key, f"{path}\n{expires}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest[:24]).decode("ascii")
