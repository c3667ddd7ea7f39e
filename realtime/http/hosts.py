"""Which names in a Host header this service answers to (DNS rebinding).

A request without a Host header is refused whatever the policy: HTTP/1.1 requires one, and an
HTTP/1.0 request without it would otherwise pass the check that every browser request meets.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

_WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})


class HostPolicy:
    """Which names in a Host header this service answers to.

    An IP address is always fine: a rebinding page is reached through its own name, never through
    an address. Names: localhost, the bind host, and `http.allowed_hosts`. With a token and no
    `allowed_hosts` any name is fine, since a rebinding page cannot send the token.
    """

    def __init__(self, bind_host: str, allowed: Iterable[str] | None, *, token_set: bool) -> None:
        names = {"localhost"}
        if bind_host.strip("[]") not in _WILDCARD_BINDS:
            names.add(_normalise(bind_host))
        given = list(allowed or ())
        listed = [name for name in given if name.strip() != "*"]
        self.any = (allowed is None and token_set) or len(listed) < len(given)
        # Names the operator listed: the only other origins (front ends, proxies) /api accepts.
        self.listed = frozenset(_normalise(name) for name in listed)
        self.names = frozenset(names | self.listed)

    def allows(self, host_header: str | None) -> bool:
        if host_header is None:  # HTTP/1.0 without Host: no name to check, so no answer
            return False
        if self.any:
            return True
        name = host_name(host_header)
        if name is None:
            return False
        return _is_ip(name) or name in self.names


def _normalise(name: str) -> str:
    return name.strip().strip("[]").rstrip(".").lower()


def host_name(value: str) -> str | None:
    """The name part of a Host header (`name`, `name:port`, `[v6]:port`); None if malformed."""
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1 :] and not value[end + 1 :].startswith(":")):
            return None
        return value[1:end].lower()
    name, _, port = value.partition(":")
    if port and not port.isdigit():
        return None
    return _normalise(name) if name else None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
