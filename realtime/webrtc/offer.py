"""The body of `POST /api/webrtc/offer`, checked before aiortc sees any of it.

Counts first, by scanning lines, because aiortc's cost grows with them: 650 video m-sections
took 1.2 s and 60 MB before aiortc found the offer unusable, and every candidate is an address
the service sends checks to (ice.py). Then the structure aiortc relies on, so that a truncated
or hand-made offer is told what is wrong in words: aiortc itself fails on those with whatever a
missing key or index raises ("cannot be used: 'a'").

An offer may also carry a stream's own settings of a capability that declares them (its switch's
name as the field: `"captions": {"language": "es", "translate": "en"}`), as a stream added through
the API can: a person on a browser camera speaks the language they speak. They are checked here
as the stream model checks them, so a bad value is a 400 before any negotiation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from pipelines.capabilities import CAPABILITIES
from pipelines.frames import InvalidStreamId, validate_stream_id
from realtime.config import WebRtcStreamSettings, validation_problems
from realtime.errors import ServiceError

OFFER_FIELDS = frozenset({"sdp", "type", "stream_id"})
MEDIA_KINDS = ("audio", "video")
# The page's offer has three (audio, video, its DataChannel); the service reads one video and one
# audio track and drains a few more.
MAX_MEDIA_SECTIONS = 8
SETUP_ROLES = frozenset({"active", "passive", "actpass", "holdconn"})


class BadOffer(ServiceError, ValueError):
    """The offer cannot be used; `str()` says why, `field` which part."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def own_switches() -> frozenset[str]:
    """The switches an offer may give settings of its own (capabilities that declare them)."""
    return frozenset(c.switch.name for c in CAPABILITIES if c.switch is not None and c.switch.settings is not None)


@dataclass(frozen=True, slots=True)
class Offer:
    sdp: str
    stream_id: str | None  # None: the service picks one
    own: Mapping[str, Any] = field(default_factory=dict)  # switch name -> its checked value

    def stream_settings(self, stream_id: str, *, audio: bool = True) -> WebRtcStreamSettings:
        """The session's stream, with the offer's own settings."""
        return WebRtcStreamSettings(id=stream_id, kind="webrtc", audio=audio, **self.own)


def _own_settings(body: dict[str, Any]) -> dict[str, Any]:
    given = {name: body[name] for name in own_switches() if name in body}
    if not given:
        return {}
    try:
        checked = WebRtcStreamSettings.model_validate({"id": "offer", "kind": "webrtc", **given})
    except ValidationError as exc:
        problem = validation_problems(exc, unknown="unknown field")[0]
        raise BadOffer(problem["field"], problem["message"]) from None
    return {name: getattr(checked, name) for name in given}


def media_kinds(sdp: str) -> set[str]:
    """The kinds of the offer's m-sections (`m=video 9 UDP/TLS/RTP/SAVPF ...`)."""
    return {line[2:].split(" ", 1)[0] for line in sdp.splitlines() if line.startswith("m=")}


def parse_offer(body: dict[str, Any], *, max_sdp_bytes: int, max_candidates: int = 64) -> Offer:
    fields = OFFER_FIELDS | own_switches()
    unknown = sorted(set(body) - fields)
    if unknown:
        raise BadOffer(unknown[0], f"unknown field (an offer has {', '.join(sorted(fields))})")
    if body.get("type") != "offer":
        raise BadOffer("type", "must be \"offer\" (answers and rollbacks are not accepted)")
    stream_id = body.get("stream_id")
    if stream_id is not None:
        try:
            validate_stream_id(stream_id)
        except InvalidStreamId:
            raise BadOffer("stream_id", "use 1-64 characters from A-Z a-z 0-9 _ -") from None
    sdp = body.get("sdp")
    if not isinstance(sdp, str) or not sdp.strip():
        raise BadOffer("sdp", "must be the offer's SDP text")
    size = len(sdp.encode("utf-8", "surrogatepass"))
    if size > max_sdp_bytes:
        raise BadOffer("sdp", f"{size} bytes, more than webrtc.max_sdp_bytes ({max_sdp_bytes})")
    if not sdp.lstrip().startswith("v=0"):
        raise BadOffer("sdp", "not an SDP session description (it must start with v=0)")
    lines = sdp.splitlines()
    sections = sum(1 for line in lines if line.startswith("m="))
    if sections > MAX_MEDIA_SECTIONS:
        raise BadOffer("sdp", f"{sections} m-sections, more than {MAX_MEDIA_SECTIONS} (one per track and one for "
                              "the data channel)")
    candidates = sum(1 for line in lines if line.startswith("a=candidate:"))
    if candidates > max_candidates:
        raise BadOffer("sdp", f"{candidates} ICE candidates, more than webrtc.max_ice_candidates ({max_candidates})")
    if not media_kinds(sdp) & set(MEDIA_KINDS):
        raise BadOffer("sdp", "the offer sends no audio or video (add a camera or microphone track)")
    problem = structure_problem(lines)
    if problem is not None:
        if not sdp.endswith(("\n", "\r")):
            problem += " (the SDP does not end with a line break: is it truncated?)"
        raise BadOffer("sdp", f"cannot be used: {problem}")
    return Offer(sdp=sdp, stream_id=stream_id, own=_own_settings(body))


def structure_problem(lines: list[str]) -> str | None:
    """What aiortc would trip on, in words: None when the offer has the parts it needs."""
    session: dict[str, str] = {}
    sections: list[tuple[str, dict[str, str]]] = []  # (m= line, its attributes by name: the first value)
    bundles: list[list[str]] = []
    for line in lines:
        if line.startswith("m="):
            sections.append((line, {}))
        elif line.startswith("a="):
            name, _, value = line[2:].partition(":")
            if name == "group" and value.startswith("BUNDLE"):
                bundles.append(value.split()[1:])
            (sections[-1][1] if sections else session).setdefault(name, value.strip())
    mids: set[str] = set()
    for number, (mline, attributes) in enumerate(sections, 1):
        fields = mline[2:].split()
        if len(fields) < 4 or not fields[1].isdigit():
            return f"m-section {number} has a malformed m= line ({mline[:40]!r})"
        where = f"m-section {number} ({fields[0]})"
        for name in ("ice-ufrag", "ice-pwd", "fingerprint", "setup"):
            if not attributes.get(name) and not session.get(name):
                return f"{where} has no a={name} line"
        setup = attributes.get("setup") or session["setup"]
        if setup not in SETUP_ROLES:
            return f"{where}: a=setup:{setup[:20]} is not one of {', '.join(sorted(SETUP_ROLES))}"
        if "mid" in attributes:
            mids.add(attributes["mid"])
    for bundle in bundles:
        missing = [mid for mid in bundle if mid not in mids]
        if missing:
            return f"the BUNDLE group names mid {missing[0][:20]!r}, which no m-section has"
    return None
