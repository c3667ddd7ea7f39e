"""Every browser session of the service: admission, negotiation, and the end of each one.

`open` turns an offer into a session: it checks the cap, negotiates with aiortc (non-trickle:
`setLocalDescription` gathers every candidate before the answer goes out), then adds the
session to the desired set of streams as a `webrtc` stream (`admit`), so the reconciler runs
it through the same graph as a camera. A session that ends, for whatever reason, takes its
stream out of the desired set (`forget`); a stream deleted over the API stops its session
through the graph. Nothing of a refused or failed offer is left behind: its peer connection
is closed before the error goes back.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from aiortc import RTCPeerConnection, RTCSessionDescription

from realtime.config import WebRtcSettings, WebRtcStreamSettings
from realtime.webrtc.ice import rtc_configuration, without_mdns_candidates
from realtime.webrtc.offer import BadOffer, Offer
from realtime.webrtc.session import ListenTo, WebRtcSession

log = logging.getLogger(__name__)

NEGOTIATION_TIMEOUT_S = 10.0  # parsing the offer and gathering host candidates take milliseconds


class SessionLimitReached(Exception):
    setting = "webrtc.max_sessions"

    def __init__(self, limit: int) -> None:
        super().__init__(f"session limit reached: {limit} sessions ({self.setting})")
        self.limit = limit


class SessionExists(Exception):
    """A session with this stream id is open or being negotiated."""


class SessionsClosed(Exception):
    """The service is shutting down."""


class NegotiationFailed(Exception):
    """aiortc could not answer in time; nothing about the offer itself is known to be wrong."""


class UnknownSession(LookupError):
    pass


@dataclass(frozen=True, slots=True)
class Answer:
    sdp: str
    stream_id: str
    close_token: str


class SessionTable:
    def __init__(
        self,
        settings: WebRtcSettings,
        *,
        admit: Callable[[WebRtcStreamSettings], object],
        forget: Callable[[str], None],
        listen: ListenTo,
    ) -> None:
        self.settings = settings
        self._admit = admit  # adds the session's stream to the desired set; raises what the registry raises
        self._forget = forget  # takes it out again (idempotent)
        self._listen = listen
        self._sessions: dict[str, WebRtcSession] = {}
        self._negotiating: set[str] = set()
        self._closing_peers: set[asyncio.Task[None]] = set()
        self._closing = False
        self.opened = 0
        self.rejected = 0  # offers refused by max_sessions
        self.ended: Counter[str] = Counter()  # why sessions ended, by reason

    @property
    def count(self) -> int:
        return len(self._sessions)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._sessions

    async def open(self, offer: Offer) -> Answer:
        if self._closing:
            raise SessionsClosed("the service is shutting down")
        if len(self._sessions) + len(self._negotiating) >= self.settings.max_sessions:
            self.rejected += 1
            limit = self.settings.max_sessions
            log.warning("webrtc session refused", extra={"reason": "session limit", "limit": limit})
            raise SessionLimitReached(limit)
        stream_id = offer.stream_id or f"webrtc-{secrets.token_hex(4)}"
        if stream_id in self._sessions or stream_id in self._negotiating:
            raise SessionExists(stream_id)
        self._negotiating.add(stream_id)
        pc = RTCPeerConnection(rtc_configuration(self.settings.ice_servers))
        session = WebRtcSession(stream_id, pc, settings=self.settings, listen=self._listen, on_end=self._session_ended)
        try:
            await self._negotiate(session, offer)
            self._admit(WebRtcStreamSettings(id=stream_id, kind="webrtc", audio="audio" in session.kinds))
        except BaseException:  # a refusal, bad SDP or a client gone mid-negotiation: leave nothing open
            await session.close_peer()
            raise
        finally:
            self._negotiating.discard(stream_id)
        self._sessions[stream_id] = session
        self.opened += 1
        log.info("webrtc session opened", extra={"stream_id": stream_id, "media": sorted(session.kinds)})
        return Answer(pc.localDescription.sdp, stream_id, session.close_token)

    async def _negotiate(self, session: WebRtcSession, offer: Offer) -> None:
        pc = session.pc
        sdp, removed = without_mdns_candidates(offer.sdp)
        if removed:
            log.debug("mDNS candidates removed from an offer", extra={"count": removed})
        try:
            async with asyncio.timeout(NEGOTIATION_TIMEOUT_S):
                await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        except TimeoutError:
            raise NegotiationFailed("reading the offer took too long") from None
        except Exception as exc:  # aiortc raises ValueError, KeyError, IndexError ... on SDP it cannot use
            raise BadOffer("sdp", f"cannot be used: {exc or type(exc).__name__}") from None
        if not session.tracks:
            raise BadOffer("sdp", "the offer sends no audio or video track (a receive-only offer?)")
        try:
            async with asyncio.timeout(NEGOTIATION_TIMEOUT_S):
                await pc.setLocalDescription(await pc.createAnswer())
        except TimeoutError:
            raise NegotiationFailed("gathering ICE candidates took too long") from None
        except Exception as exc:  # e.g. no codec in common
            raise BadOffer("sdp", f"cannot be answered: {exc or type(exc).__name__}") from None

    def source(self, stream_id: str) -> WebRtcSession:
        """The session behind a `webrtc` stream, for the runner the reconciler starts."""
        session = self._sessions.get(stream_id)
        if session is None:
            raise UnknownSession(f"stream {stream_id!r}: its browser session has ended")
        return session

    def close_with_token(self, stream_id: str, token: str) -> bool:
        """End a session whose close token matches (the page's `pagehide` beacon)."""
        session = self._sessions.get(stream_id)
        expected = session.close_token if session is not None else secrets.token_urlsafe(24)
        # surrogatepass: a lone surrogate from the JSON body is bytes that never match, not an error.
        matches = hmac.compare_digest(token.encode("utf-8", "surrogatepass"), expected.encode())
        if session is None or not matches:
            return False
        session.close("the page went away")
        return True

    def discard(self, stream_id: str) -> None:
        """The session's stream is gone from the registry without its run having started (deleted
        while an earlier run of the id was stopping): end the session too, or it would hold its
        peer connection and a slot with no timer running."""
        session = self._sessions.get(stream_id)
        if session is not None and not session.running:
            session.close("the stream was deleted")

    def _session_ended(self, session: WebRtcSession) -> None:
        if self._sessions.get(session.stream_id) is session:
            del self._sessions[session.stream_id]
            self.ended[session.end_reason or "unknown"] += 1
            self._forget(session.stream_id)
        if not session.running:  # a run closes its own peer; one that never ran is closed here
            task = session.close_peer()
            self._closing_peers.add(task)
            task.add_done_callback(self._closing_peers.discard)

    async def aclose(self) -> None:
        """End every session and wait until every peer connection is closed (shutdown)."""
        self._closing = True
        sessions = list(self._sessions.values())
        for session in sessions:
            session.close("the service is shutting down")
        peers = [session.close_peer() for session in sessions] + list(self._closing_peers)
        if peers:
            await asyncio.gather(*peers, return_exceptions=True)
