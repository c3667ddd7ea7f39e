"""The body of `POST /api/webrtc/offer`, checked before aiortc sees any of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.frames import InvalidStreamId, validate_stream_id

OFFER_FIELDS = frozenset({"sdp", "type", "stream_id"})
MEDIA_KINDS = ("audio", "video")


class BadOffer(ValueError):
    """The offer cannot be used; `str()` says why, `field` which part."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Offer:
    sdp: str
    stream_id: str | None  # None: the service picks one


def media_kinds(sdp: str) -> set[str]:
    """The kinds of the offer's m-sections (`m=video 9 UDP/TLS/RTP/SAVPF ...`)."""
    return {line[2:].split(" ", 1)[0] for line in sdp.splitlines() if line.startswith("m=")}


def parse_offer(body: dict[str, Any], *, max_sdp_bytes: int) -> Offer:
    unknown = sorted(set(body) - OFFER_FIELDS)
    if unknown:
        raise BadOffer(unknown[0], f"unknown field (an offer has {', '.join(sorted(OFFER_FIELDS))})")
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
    if not media_kinds(sdp) & set(MEDIA_KINDS):
        raise BadOffer("sdp", "the offer sends no audio or video (add a camera or microphone track)")
    return Offer(sdp=sdp, stream_id=stream_id)
