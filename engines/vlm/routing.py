"""Which endpoint serves a stream: rendezvous (highest-random-weight) hashing on the route key.

Every worker computes the same order for a stream without sharing any state, so a stream's
prefix stays cached on one vLLM replica; adding or removing an endpoint moves only the streams
whose first choice it was."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def rendezvous_order(route_key: str, endpoints: Sequence[str]) -> list[str]:
    """`endpoints` ordered by preference for `route_key` (first = home)."""
    return sorted(endpoints, key=lambda endpoint: _weight(route_key, endpoint), reverse=True)


def _weight(route_key: str, endpoint: str) -> int:
    digest = hashlib.blake2b(f"{endpoint}\0{route_key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
