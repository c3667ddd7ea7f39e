"""The body of a WHIP trickle `PATCH` (`application/trickle-ice-sdpfrag`, RFC 8840 as RFC 9725
uses it), read before aiortc sees any of it.

A WHIP client that trickles posts its offer before its candidates are gathered and sends them
afterwards, a few at a time, as SDP fragments: `a=ice-ufrag`/`a=ice-pwd` naming the ICE
session, one `m=` line per media section (with `a=mid`), its `a=candidate` lines and at the end
`a=end-of-candidates`. A fragment whose credentials differ from the offer's is an ICE restart,
which the service does not do (the route answers 422, as RFC 9725 says for a session that
trickles but does not restart). Every candidate is an address the service sends checks to, so
the fragment is bounded like an offer: its size, and its candidates counted with the offer's
against `webrtc.max_ice_candidates` (sessions.py keeps the tally).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from realtime.webrtc.offer import BadOffer


@dataclass(frozen=True, slots=True)
class TrickledCandidate:
    line: str  # the `a=candidate:...` line as sent
    mid: str | None  # the media section it belongs to, when the fragment says
    mline_index: int  # its media section's place among the fragment's m= lines (0 when there is none)


@dataclass(frozen=True, slots=True)
class Fragment:
    ufrag: str | None
    pwd: str | None
    candidates: list[TrickledCandidate] = field(default_factory=list)
    end: bool = False  # a=end-of-candidates: the client has gathered every candidate


def ice_credentials(sdp: str) -> tuple[str | None, str | None]:
    """The first `a=ice-ufrag` and `a=ice-pwd` of an offer (BUNDLE: one ICE session for all)."""
    ufrag = pwd = None
    for line in sdp.splitlines():
        if ufrag is None and line.startswith("a=ice-ufrag:"):
            ufrag = line.split(":", 1)[1].strip()
        elif pwd is None and line.startswith("a=ice-pwd:"):
            pwd = line.split(":", 1)[1].strip()
    return ufrag, pwd


def parse_fragment(text: str, *, max_bytes: int, max_candidates: int) -> Fragment:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise BadOffer("sdpfrag", f"{size} bytes, more than webrtc.max_sdp_bytes ({max_bytes})")
    ufrag = pwd = None
    mid: str | None = None
    section = -1
    end = False
    candidates: list[TrickledCandidate] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("m="):
            section += 1
            mid = None
        elif line.startswith("a=mid:"):
            mid = line[6:].strip()
        elif line.startswith("a=ice-ufrag:"):
            ufrag = line[12:].strip()
        elif line.startswith("a=ice-pwd:"):
            pwd = line[10:].strip()
        elif line == "a=end-of-candidates":
            end = True
        elif line.startswith("a=candidate:"):
            if len(line.split()) < 8:  # foundation component transport priority address port typ type
                raise BadOffer("sdpfrag", f"malformed candidate line ({line[:60]!r})")
            candidates.append(TrickledCandidate(line, mid, max(section, 0)))
            if len(candidates) > max_candidates:
                raise BadOffer("sdpfrag", f"more than webrtc.max_ice_candidates ({max_candidates}) candidates")
        elif line[:2] not in ("a=", "m=", "c="):
            raise BadOffer("sdpfrag", f"not an SDP fragment line ({line[:40]!r})")
    return Fragment(ufrag, pwd, candidates, end)
