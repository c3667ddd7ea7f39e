"""ICE for browser sessions: the configured servers only, and no mDNS candidates.

aiortc falls back to a public Google STUN server when given no list; a service that may run
without internet access must never depend on that, so the list is always passed, empty by
default. Browsers that hold no camera grant hide their host addresses behind `<uuid>.local`
names; resolving those would open a multicast socket on port 5353, so they are removed from
offers and the connection goes through a peer-reflexive candidate instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiortc import RTCConfiguration, RTCIceServer

from realtime.config import IceServerSettings


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


def is_mdns_candidate(line: str) -> bool:
    # a=candidate:<foundation> <component> <transport> <priority> <address> <port> typ ...
    if not line.startswith("a=candidate:"):
        return False
    fields = line.split()
    return len(fields) > 4 and fields[4].lower().endswith(".local")


def without_mdns_candidates(sdp: str) -> tuple[str, int]:
    """The SDP without `.local` host candidates, and how many were removed."""
    lines = sdp.splitlines()
    kept = [line for line in lines if not is_mdns_candidate(line)]
    removed = len(lines) - len(kept)
    return ("\r\n".join(kept) + "\r\n" if removed else sdp), removed
