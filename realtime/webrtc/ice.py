"""ICE for browser sessions: the configured servers only, no mDNS, and no UDP sent anywhere a
client names.

aiortc falls back to a public Google STUN server when given no list; a service that may run
without internet access must never depend on that, so the list is always passed, empty by
default. Browsers that hold no camera grant hide their host addresses behind `<uuid>.local`
names; resolving those would open a multicast socket on port 5353, so they are removed from
offers and the connection goes through a peer-reflexive candidate instead.

Every remote candidate is an address the service will send STUN checks to, for as long as the
session connects, so an offer is a way to make the service send UDP wherever its client likes
(951 candidates once made 2,947 STUN requests in 15 s). Hence:

- an offer lists at most `webrtc.max_ice_candidates` candidates (a browser lists a handful per
  network interface); past it the offer is refused before aiortc reads it (`offer.py`);
- candidates on addresses no browser is reached at are removed, as mDNS ones are: loopback,
  link-local (169.254.0.0/16, fe80::/10, so the 169.254.169.254 metadata service too), the
  IPv6 metadata address fd00:ec2::254, multicast, unspecified and reserved ranges, each also in
  its IPv4-mapped form; private ranges stay (browsers on the LAN are the common case).
  `webrtc.allow_local_candidates` keeps them (a browser on the service's own machine that
  offers its loopback address). The connection can still succeed through the address the
  browser's checks actually come from (peer-reflexive), which is answered wherever it is;
- each session sends at most `STUN_BURST` STUN requests at once and `STUN_RATE` a second on
  average (connectivity checks, their retransmissions, consent checks); a request over the
  budget is not sent, as if lost, and STUN retransmits it later. A browser's few pairs
  connect within the burst.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aioice import stun
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection

from realtime.config import IceServerSettings
from realtime.sources.policy import local_reason

STUN_RATE = 10.0  # STUN requests a second, per session, on average
STUN_BURST = 20  # at once; a browser's pairs (a few per interface) fit in it

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def rtc_configuration(servers: Sequence[IceServerSettings]) -> RTCConfiguration:
    return RTCConfiguration(
        iceServers=[
            RTCIceServer(
                urls=list(server.urls),
                username=server.username,
                credential=server.credential.get_secret_value() if server.credential else None,
            )
            for server in servers
        ]
    )


def candidate_address(line: str) -> str | None:
    """The address of an `a=candidate:` line, None for any other line."""
    # a=candidate:<foundation> <component> <transport> <priority> <address> <port> typ ...
    if not line.startswith("a=candidate:"):
        return None
    fields = line.split()
    return fields[4] if len(fields) > 4 else ""


def is_mdns_candidate(line: str) -> bool:
    address = candidate_address(line)
    return address is not None and address.lower().endswith(".local")


def refused_address(address: IpAddress) -> str | None:
    """Why the service must not send to `address` for a client, or None when it may (the same rule
    as for camera sources: private LAN addresses are fine, this machine and its link are not)."""
    return local_reason(address)


@dataclass(frozen=True, slots=True)
class Screened:
    sdp: str
    mdns: int  # `.local` candidates removed
    refused: int  # candidates on addresses the service does not send to, removed


def screen_candidates(sdp: str, *, allow_local: bool = False) -> Screened:
    """The SDP without mDNS candidates and (unless `allow_local`) without candidates on refused
    addresses. Candidates on names that are not IP addresses are left: aioice ignores them."""
    lines = sdp.splitlines()
    kept: list[str] = []
    mdns = refused = 0
    for line in lines:
        address = candidate_address(line)
        if address is None:
            kept.append(line)
        elif address.lower().endswith(".local"):
            mdns += 1
        elif not allow_local and _refused(address):
            refused += 1
        else:
            kept.append(line)
    if not (mdns or refused):
        return Screened(sdp, 0, 0)
    return Screened("\r\n".join(kept) + "\r\n", mdns, refused)


def candidate_refusal(line: str, *, allow_local: bool = False) -> str | None:
    """Why one trickled `a=candidate:` line is not used ("mdns" or "refused", as
    `screen_candidates` counts them), or None when it may be."""
    address = candidate_address(line)
    if address is None:
        return None
    if address.lower().endswith(".local"):
        return "mdns"
    if not allow_local and _refused(address):
        return "refused"
    return None


def without_mdns_candidates(sdp: str) -> tuple[str, int]:
    """The SDP without `.local` host candidates, and how many were removed."""
    screened = screen_candidates(sdp, allow_local=True)
    return screened.sdp, screened.mdns


def _refused(text: str) -> bool:
    try:
        address = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return False
    return refused_address(address) is not None


class StunBudget:
    """A token bucket for one session's outgoing STUN requests."""

    def __init__(self, rate: float = STUN_RATE, burst: int = STUN_BURST) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._at = time.monotonic()
        self.created_at = self._at  # what the bucket has let through is bounded from here on
        self.sent = 0
        self.deferred = 0  # requests not sent: over the budget (STUN retransmits them later)

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            self.deferred += 1
            return False
        self._tokens -= 1.0
        self.sent += 1
        return True


def limit_stun_requests(pc: RTCPeerConnection, budget: StunBudget) -> int:
    """Put every STUN request `pc` sends through `budget`. Call it right after
    `setLocalDescription` (its sockets exist then, and no check has started yet); returns how
    many sockets were limited."""
    connections: dict[int, Any] = {}
    for transceiver in pc.getTransceivers():
        dtls = transceiver.receiver.transport
        if dtls is not None:
            connections[id(dtls.transport)] = dtls.transport._connection
    if pc.sctp is not None:
        connections[id(pc.sctp.transport.transport)] = pc.sctp.transport.transport._connection
    limited = 0
    for connection in connections.values():
        for protocol in connection._protocols:
            if not getattr(protocol, "_vidsentry_limited", False):
                _limit(protocol, budget)
                limited += 1
    return limited


def _limit(protocol: Any, budget: StunBudget) -> None:
    send_stun = protocol.send_stun

    def limited_send_stun(message: stun.Message, addr: tuple[str, int]) -> None:
        if message.message_class == stun.Class.REQUEST and not budget.take():
            return  # as if lost: the transaction retransmits it after its timeout
        send_stun(message, addr)

    protocol.send_stun = limited_send_stun
    protocol._vidsentry_limited = True
