"""Every browser session of the service: admission, negotiation, and the end of each one.

`open` turns an offer into a session: it checks the caps, negotiates with aiortc (non-trickle:
`setLocalDescription` gathers every candidate before the answer goes out), then adds the
session to the desired set of streams as a `webrtc` stream (`admit`), so the reconciler runs
it through the same graph as a camera. A session that ends, for whatever reason, takes its
stream out of the desired set (`forget`); a stream deleted over the API stops its session
through the graph. Nothing of a refused or failed offer is left behind: its peer connection
is closed before the error goes back.

Admission has two budgets. `max_sessions` counts every session. Sessions not yet connected
(being negotiated, or answered and waiting for ICE and DTLS) also count against the smaller
`max_connecting`, and those of one client address against `max_connecting_per_client`: an offer
whose peer never connects holds its slot for `connect_timeout_s`, and four of them used to lock
every new session out for that long, again and again. A session leaves the connecting budget
when it connects or ends.

WHIP (realtime/http/whip.py) opens sessions through the same `open`; its clients may trickle
their candidates afterwards (`trickle`), screened and counted as an offer's are, and find their
session by its random resource id (`whip_session`).

Each session's peer connection is bounded before the answer goes out: its remote candidates
screened and its STUN requests rate-limited (ice.py), its SCTP transport taking only small
DataChannel messages (sctp.py). A peer that sends more ends its session; each of these is
counted (`refusals`, exported by metrics.py).
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
from aiortc.sdp import candidate_from_sdp

from realtime.config import WebRtcSettings, WebRtcStreamSettings
from realtime.errors import LimitReached, ServiceError
from realtime.webrtc.dtls import accept_rsa_peers
from realtime.webrtc.ice import (
    StunBudget,
    candidate_refusal,
    limit_stun_requests,
    rtc_configuration,
    screen_candidates,
)
from realtime.webrtc.offer import BadOffer, Offer
from realtime.webrtc.sctp import bound_sctp
from realtime.webrtc.session import ListenTo, WebRtcSession
from realtime.webrtc.trickle import Fragment, ice_credentials

log = logging.getLogger(__name__)

NEGOTIATION_TIMEOUT_S = 10.0  # parsing the offer and gathering host candidates take milliseconds


def same_resource(given: str, issued: str | None) -> bool:
    """A resource id from a URL against the one issued, in constant time; with none issued, against
    a random one, so the time taken never says whether a resource exists."""
    expected = issued if issued is not None else secrets.token_urlsafe(16)
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())


class SessionLimitReached(LimitReached):
    setting = "webrtc.max_sessions"

    def __init__(self, limit: int) -> None:
        super().__init__(f"session limit reached: {limit} sessions ({self.setting})", limit=limit)


class TooManyConnecting(SessionLimitReached):
    """Too many sessions still connecting, of all clients or of this one."""

    def __init__(self, limit: int, setting: str, whose: str) -> None:
        LimitReached.__init__(self, f"{limit} sessions {whose} still connecting ({setting}); try again when they "
                                    "connect or time out", limit=limit, setting=setting)


class SessionExists(ServiceError):
    """A session with this stream id is open or being negotiated."""


class SessionsClosed(ServiceError):
    """The service is shutting down."""


class NegotiationFailed(ServiceError):
    """aiortc could not answer in time; nothing about the offer itself is known to be wrong."""


class UnknownSession(ServiceError, LookupError):
    pass


class IceRestartRefused(ServiceError):
    """A trickle PATCH with new ICE credentials: an ICE restart, which sessions do not do."""


@dataclass(frozen=True, slots=True)
class Trickled:
    added: int  # candidates handed to aiortc
    removed: int  # candidates not used: mDNS names and refused addresses (ice.py)


@dataclass(frozen=True, slots=True)
class Answer:
    sdp: str
    stream_id: str
    close_token: str
    resource_id: str = ""  # the WHIP resource: /whip/{stream_id}/{resource_id}
    etag: str = ""


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
        self.rejected_connecting = 0  # offers refused by max_connecting / max_connecting_per_client
        self.ended: Counter[str] = Counter()  # why sessions ended, by reason
        # What peers did past a bound: "channel" (a DataChannel message too large; the session ended),
        # "candidates" (remote candidates removed by the address policy), "stun_deferred" (STUN
        # requests held back by the rate limit).
        self.refusals: Counter[str] = Counter()
        self._clients: dict[str, str] = {}  # stream id -> client address, while negotiating or connecting
        self._stun: dict[str, StunBudget] = {}

    @property
    def count(self) -> int:
        return len(self._sessions)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._sessions

    @property
    def connecting(self) -> int:
        """Sessions being negotiated or answered and not connected yet."""
        return len(self._clients)

    def _admit_offer(self, client: str) -> None:
        settings = self.settings
        if len(self._sessions) + len(self._negotiating) >= settings.max_sessions:
            self.rejected += 1
            log.warning("webrtc session refused", extra={"reason": "session limit", "limit": settings.max_sessions})
            raise SessionLimitReached(settings.max_sessions)
        if self.connecting >= settings.max_connecting:
            self.rejected_connecting += 1
            raise TooManyConnecting(settings.max_connecting, "webrtc.max_connecting", "are")
        per_client = settings.max_connecting_per_client
        if sum(1 for owner in self._clients.values() if owner == client) >= per_client:
            self.rejected_connecting += 1
            raise TooManyConnecting(per_client, "webrtc.max_connecting_per_client", "of this client are")

    async def open(self, offer: Offer, client: str = "") -> Answer:
        """A session for `offer` from `client` (its address: the per-client connecting budget)."""
        if self._closing:
            raise SessionsClosed("the service is shutting down")
        self._admit_offer(client)
        stream_id = offer.stream_id or f"webrtc-{secrets.token_hex(4)}"
        if stream_id in self._sessions or stream_id in self._negotiating:
            raise SessionExists(stream_id)
        self._negotiating.add(stream_id)
        self._clients[stream_id] = client
        pc = RTCPeerConnection(rtc_configuration(self.settings.ice_servers))
        accept_rsa_peers(pc)
        session = WebRtcSession(
            stream_id, pc, settings=self.settings, listen=self._listen, on_end=self._session_ended,
            on_connected=self._session_connected,
        )
        try:
            await self._negotiate(session, offer)
            self._admit(offer.stream_settings(stream_id, audio="audio" in session.kinds))
        except BaseException:  # a refusal, bad SDP or a client gone mid-negotiation: leave nothing open
            self._clients.pop(stream_id, None)
            self._count_stun(stream_id)
            await session.close_peer()
            raise
        finally:
            self._negotiating.discard(stream_id)
        if session.end_reason is not None or session.connected_once:  # both while the answer was made
            self._clients.pop(stream_id, None)
        if session.end_reason is not None:
            self._count_stun(stream_id)
        self._sessions[stream_id] = session
        self.opened += 1
        log.info("webrtc session opened", extra={"stream_id": stream_id, "media": sorted(session.kinds)})
        return Answer(pc.localDescription.sdp, stream_id, session.close_token, session.resource_id, session.etag)

    async def _negotiate(self, session: WebRtcSession, offer: Offer) -> None:
        pc = session.pc
        session.remote_ice = ice_credentials(offer.sdp)
        session.candidates = sum(1 for line in offer.sdp.splitlines() if line.startswith("a=candidate:"))
        screened = screen_candidates(offer.sdp, allow_local=self.settings.allow_local_candidates)
        if screened.mdns or screened.refused:
            log.debug("candidates removed from an offer", extra={"mdns": screened.mdns, "refused": screened.refused})
            self.refusals["candidates"] += screened.refused
        await read_offer(pc, screened.sdp)
        if not session.tracks:
            raise BadOffer("sdp", "the offer sends no audio or video track (a receive-only offer?)")
        if pc.sctp is not None:
            bound_sctp(pc.sctp, lambda reason: self._channel_refused(session, reason))
        await make_answer(pc)
        # Right away: the checks start in a task setLocalDescription scheduled, after this returns.
        budget = self._stun[session.stream_id] = StunBudget()
        limit_stun_requests(pc, budget)

    def _channel_refused(self, session: WebRtcSession, reason: str) -> None:
        self.refusals["channel"] += 1
        session.close(reason)

    def _session_connected(self, session: WebRtcSession) -> None:
        self._clients.pop(session.stream_id, None)

    def _count_stun(self, stream_id: str) -> None:
        budget = self._stun.pop(stream_id, None)
        if budget is not None:
            self.refusals["stun_deferred"] += budget.deferred

    def source(self, stream_id: str) -> WebRtcSession:
        """The session behind a `webrtc` stream, for the runner the reconciler starts."""
        session = self._sessions.get(stream_id)
        if session is None:
            raise UnknownSession(f"stream {stream_id!r}: its browser session has ended")
        return session

    def whip_session(self, stream_id: str, resource_id: str) -> WebRtcSession | None:
        """The session behind a WHIP resource URL, or None (unknown stream, or not its resource)."""
        session = self._sessions.get(stream_id)
        matches = same_resource(resource_id, session.resource_id if session is not None else None)
        return session if session is not None and matches else None

    async def trickle(self, session: WebRtcSession, fragment: Fragment) -> Trickled:
        """Hand a trickle PATCH's candidates to the session's ICE agent, screened and counted as an
        offer's are. IceRestartRefused for new credentials; BadOffer past max_ice_candidates."""
        ufrag, pwd = session.remote_ice
        given = (fragment.ufrag, fragment.pwd)
        if any(value is not None and value != known for value, known in zip(given, (ufrag, pwd), strict=True)):
            raise IceRestartRefused("the fragment carries new ICE credentials: an ICE restart")
        limit = self.settings.max_ice_candidates
        if session.candidates + len(fragment.candidates) > limit:
            raise BadOffer("sdpfrag", f"more than webrtc.max_ice_candidates ({limit}) candidates in this session")
        session.candidates += len(fragment.candidates)
        added = removed = 0
        for trickled in fragment.candidates:
            if candidate_refusal(trickled.line, allow_local=self.settings.allow_local_candidates) is not None:
                removed += 1
                continue
            try:
                candidate = candidate_from_sdp(trickled.line.split(":", 1)[1])
            except (ValueError, IndexError) as exc:
                raise BadOffer("sdpfrag", f"malformed candidate line ({trickled.line[:60]!r})") from exc
            candidate.sdpMid = trickled.mid
            # By mid when the fragment names it: aiortc matches either, and an index could name another section.
            candidate.sdpMLineIndex = trickled.mline_index if trickled.mid is None else None
            try:
                await session.pc.addIceCandidate(candidate)
            except ValueError as exc:  # aioice: after end-of-candidates, or no section matches
                raise BadOffer("sdpfrag", f"candidate not taken: {exc}") from exc
            added += 1
        if fragment.end:
            await session.pc.addIceCandidate(None)
        self.refusals["candidates"] += removed
        return Trickled(added, removed)

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
        if self._sessions.get(session.stream_id) is session or session.stream_id not in self._negotiating:
            self._clients.pop(session.stream_id, None)
            self._count_stun(session.stream_id)
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


async def read_offer(pc: RTCPeerConnection, sdp: str) -> None:
    """`setRemoteDescription` of an offer, in time; what aiortc cannot use is a BadOffer in words."""
    try:
        async with asyncio.timeout(NEGOTIATION_TIMEOUT_S):
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
    except TimeoutError:
        raise NegotiationFailed("reading the offer took too long") from None
    except Exception as exc:  # aiortc raises ValueError, KeyError, IndexError ... on SDP it cannot use
        raise BadOffer("sdp", f"cannot be used: {_in_words(exc)}") from None


async def make_answer(pc: RTCPeerConnection, hint: str = "") -> None:
    """`setLocalDescription` of the answer, every candidate gathered, in time."""
    try:
        async with asyncio.timeout(NEGOTIATION_TIMEOUT_S):
            await pc.setLocalDescription(await pc.createAnswer())
    except TimeoutError:
        raise NegotiationFailed("gathering ICE candidates took too long") from None
    except Exception as exc:  # e.g. no codec in common
        raise BadOffer("sdp", f"cannot be answered{hint}: {_in_words(exc)}") from None


def _in_words(exc: Exception) -> str:
    """aiortc's own message when it is one; what a missing key or index means otherwise."""
    if isinstance(exc, ValueError) and str(exc) and "unpack" not in str(exc) and "literal" not in str(exc):
        return str(exc)
    return f"the SDP is malformed or truncated where aiortc reads it ({type(exc).__name__}: {str(exc)[:60]})"
