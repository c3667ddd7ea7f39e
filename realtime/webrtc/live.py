"""Live viewers (WHEP): a camera's H.264 packets forwarded to browsers as they came, and every
other stream's frames encoded once for all its viewers.

For an H.264 camera nothing is decoded or encoded for a viewer: the source's reader thread hands
each encoded video packet to the stream's `LiveFeed` (a packet consumer of its graph, beside
clips), which copies it to every viewer's queue on the event loop; each viewer's `PacketTrack`
gives aiortc's sender `av.Packet`s, which its H.264 encoder only packetizes (`pack`). The cost per
viewer is a copy of the bytes, SRTP and UDP. A stream without such packets (a browser or WHIP
session, GStreamer ingest, an MPEG-4 or HEVC camera) has its decoded frames encoded to H.264 by
one `LiveEncoder` per stream (realtime.webrtc.live_encode), only while it has viewers, and its
packets take the same path. `webrtc.live_encode: false` refuses those streams instead.

A viewer starts at a keyframe, with the parameter sets in front of it (engines.media.h264). Its
queue is bounded (`webrtc.viewer_queue_packets`): a viewer that falls that far behind drops its
queue and skips to the next keyframe (counted), and one that falls behind
`webrtc.max_viewer_skips` times in a row is dropped (counted), so a slow viewer never holds
memory or slows the others. Viewers are bounded by `webrtc.max_viewers`.

The RTP timestamp of each frame is its pts at 90 kHz plus the sender's random origin; the origin
is read once the first frame has gone out (`rtp_origin`), so the page can map the RTP timestamp
of the frame it shows back to the pts the events carry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import av
from aiortc import RTCPeerConnection, RTCRtpSender
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcpeerconnection import filter_preferred_codecs

from engines.media.h264 import AnnexB, NotH264
from engines.media.remux import CodecHeader, EncodedPacket
from pipelines.graph.stage import StageContext
from pipelines.tasks import TaskOwner
from realtime.config import WebRtcSettings
from realtime.errors import LimitReached, ServiceError
from realtime.webrtc.dtls import accept_rsa_peers
from realtime.webrtc.ice import rtc_configuration, screen_candidates
from realtime.webrtc.live_encode import STAGE_NAME as ENCODER_STAGE
from realtime.webrtc.live_encode import EncodeTotals, LiveEncoder
from realtime.webrtc.offer import BadOffer
from realtime.webrtc.sessions import SessionsClosed, make_answer, read_offer, same_resource

log = logging.getLogger(__name__)

RTP_CLOCK = 90_000
# Why a viewer ends: DELETE, the stream gone, its connection failed or closed, not connected within
# webrtc.connect_timeout_s, too far behind too often (dropped), shutdown.
ENDINGS = ("deleted", "stream_ended", "connection", "connect_timeout", "behind", "shutdown")
TIME_BASE = Fraction(1, RTP_CLOCK)
H264_AND_RTX = ("video/h264", "video/rtx")


class ViewerLimitReached(LimitReached):
    setting = "webrtc.max_viewers"

    def __init__(self, limit: int) -> None:
        super().__init__(f"viewer limit reached: {limit} viewers ({self.setting})", limit=limit)


class NotOffered(ServiceError):
    """The stream exists but has no live video to forward; `str()` says why."""


@dataclass(slots=True)
class ViewerStats:
    packets: int = 0  # handed to aiortc
    skipped: int = 0  # packets dropped from the queue when the viewer fell behind
    skips: int = 0  # times it fell behind and skipped to the next keyframe
    before_keyframe: int = 0  # packets before its first keyframe (never sent)


class PacketTrack(MediaStreamTrack):
    """One viewer's video: encoded packets, newest GOP first, from a bounded queue."""

    kind = "video"

    def __init__(self, *, max_packets: int, max_skips: int, on_behind: Callable[[], None]) -> None:
        super().__init__()
        self.stats = ViewerStats()
        self._queue: deque[tuple[float, EncodedPacket]] = deque()
        self._ready = asyncio.Event()
        self._max_packets = max_packets
        self._max_skips = max_skips
        self._on_behind = on_behind
        self._waiting_keyframe = True
        self._behind_in_a_row = 0
        self._converters: dict[int, AnnexB] = {}
        self.sent_pts: int | None = None  # the pts (90 kHz) of the packet aiortc took last
        self.sent_count = 0

    def offer(self, t: float, packet: EncodedPacket) -> None:
        """From the event loop: queue `packet`, or skip to the next keyframe when full."""
        if self.readyState != "live":
            return
        if self._waiting_keyframe:
            if not packet.keyframe:
                self.stats.before_keyframe += 1
                return
            self._waiting_keyframe = False
        if len(self._queue) >= self._max_packets:
            self.stats.skipped += len(self._queue)
            self.stats.skips += 1
            self._queue.clear()
            self._behind_in_a_row += 1
            if self._behind_in_a_row >= self._max_skips:
                self.stop()  # takes nothing more, whatever the owner does
                self._on_behind()
                return
            if not packet.keyframe:
                self._waiting_keyframe = True
                self.stats.before_keyframe += 1
                return
        self._queue.append((t, packet))
        self._ready.set()

    async def recv(self) -> av.Packet:
        while True:
            while not self._queue:
                if self.readyState != "live":
                    raise MediaStreamError
                self._ready.clear()
                await self._ready.wait()
            if self.readyState != "live":
                raise MediaStreamError
            t, packet = self._queue.popleft()
            if not self._queue:
                self._behind_in_a_row = 0  # caught up
            try:
                data = self._annexb(packet.header).convert(packet.data, packet.keyframe)
            except NotH264:  # a packet that is not what its header says: wait for a clean keyframe
                self.stats.skipped += 1
                self._waiting_keyframe = True
                continue
            out = av.Packet(data)
            out.pts = round(t * RTP_CLOCK)
            out.time_base = TIME_BASE
            self.sent_pts = out.pts
            self.sent_count += 1
            self.stats.packets += 1
            return out

    def _annexb(self, header: CodecHeader) -> AnnexB:
        converter = self._converters.get(id(header))
        if converter is None or converter.header is not header:
            self._converters = {id(header): AnnexB(header)}  # one connection at a time
            converter = self._converters[id(header)]
        return converter

    def stop(self) -> None:
        super().stop()
        self._queue.clear()
        self._ready.set()


class LiveFeed:
    """One stream's packets, copied to its viewers. `put` is the graph's packet consumer: it runs
    on the source's reader thread and only schedules the copy on the event loop. A stream whose
    packets are not H.264 gets its packets from its `encoder` instead (on the event loop)."""

    def __init__(self, stream_id: str, loop: asyncio.AbstractEventLoop, *, demuxed: bool = True) -> None:
        self.stream_id = stream_id
        self.codec: str | None = None  # of the newest connection, once its first packet came
        self.demuxed = demuxed  # the source hands packets (else decoded frames only)
        self.encoder: LiveEncoder | None = None  # for a stream whose packets are not forwarded
        self.viewers: set[PacketTrack] = set()
        self.packets = 0
        self._loop = loop

    @property
    def forwarding(self) -> bool:
        """The camera's own packets go to the viewers (H.264)."""
        return self.demuxed and self.codec == "h264"

    @property
    def ready(self) -> bool:
        """Video has come: forwarded packets, or frames for the encoder."""
        return self.forwarding or (self.encoder is not None and self.encoder.seen > 0)

    def wants_frames(self) -> bool:
        """The encoder should run: viewers watch, and the stream's packets cannot be forwarded
        (for a camera, known from its first packet)."""
        return bool(self.viewers) and not self.forwarding and (not self.demuxed or self.codec is not None)

    def joined(self, track: PacketTrack) -> None:
        self.viewers.add(track)
        if self.encoder is not None and not self.forwarding:
            self.encoder.keyframe_next()  # its first picture with the next frame, not a GOP later

    def put(self, t: float, packet: EncodedPacket) -> None:
        self.packets += 1
        self.codec = packet.header.codec
        if self.viewers and self.codec == "h264":
            with contextlib.suppress(RuntimeError):  # the loop closed at shutdown
                self._loop.call_soon_threadsafe(self._copy, t, packet)

    def encoded(self, t: float, packet: EncodedPacket) -> None:
        """The encoder's packet (on the event loop)."""
        if not self.forwarding:
            self._copy(t, packet)

    def _copy(self, t: float, packet: EncodedPacket) -> None:
        for track in list(self.viewers):
            track.offer(t, packet)


@dataclass(frozen=True, slots=True)
class ViewerAnswer:
    sdp: str
    resource_id: str
    etag: str


@dataclass(eq=False)
class Viewer:
    stream_id: str
    pc: RTCPeerConnection
    track: PacketTrack
    resource_id: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    etag: str = field(default_factory=lambda: f'"{secrets.token_hex(8)}"')
    opened_at: float = field(default_factory=time.monotonic)
    end_reason: str | None = None
    timer: asyncio.Task[None] | None = None

    @property
    def rtp_origin(self) -> int | None:
        """The RTP timestamp of pts 0 (mod 2**32), once a frame has gone out: what the sender
        added to every pts. aiortc keeps the last timestamp it sent in a private attribute."""
        sender = next((t.sender for t in self.pc.getTransceivers() if t.sender.track is self.track), None)
        sent = getattr(sender, "_RTCRtpSender__rtp_timestamp", None)
        pts = self.track.sent_pts
        if not isinstance(sent, int) or pts is None or self.track.sent_count < 2:
            return None  # the second recv() means the first frame was sent
        return (sent - pts) % 2**32


class LiveView:
    """Every stream's feed and every viewer: admission, negotiation, and the end of each one."""

    def __init__(self, settings: WebRtcSettings) -> None:
        self.settings = settings
        self._feeds: dict[str, LiveFeed] = {}
        self._viewers: dict[str, Viewer] = {}  # by resource id
        self._negotiating = 0
        self._closing = False
        self._timers = TaskOwner("live viewers")  # each viewer's connect timeout
        self._closes = TaskOwner("live viewers closing")
        self._closing_peers: set[asyncio.Task[None]] = set()
        self.opened = 0
        self.refused = 0  # offers refused by max_viewers
        self.ended: Counter[str] = Counter()  # why viewers ended (ENDINGS); "behind" is a dropped slow viewer
        self._skips_ended = 0
        self.encoding = EncodeTotals()  # every stream's live encoder together

    # -- the graph's side ------------------------------------------------------------------------

    def build(self, ctx: StageContext) -> LiveEncoder | None:
        """A stage factory: it makes the stream's feed a packet consumer (a source that demuxes),
        and builds the stream's live encoder, idle until a viewer of a stream whose packets are
        not forwarded comes (unless `webrtc.live_encode` is off)."""
        encode = self.settings.live_encode
        if not ctx.demuxed and not encode:
            self._feeds.pop(ctx.stream_id, None)
            return None
        loop = asyncio.get_running_loop()
        feed = self._feeds.get(ctx.stream_id)
        if feed is None:
            feed = self._feeds[ctx.stream_id] = LiveFeed(ctx.stream_id, loop, demuxed=ctx.demuxed)
        feed.demuxed = ctx.demuxed
        feed.encoder = None
        if ctx.demuxed:
            ctx.packets(feed)
        if not encode:
            return None
        compute = ctx.engines.detector.compute if ctx.engines.detector is not None else None
        feed.encoder = LiveEncoder(ctx.stream_id, ctx.frames(ENCODER_STAGE), wanted=feed.wants_frames,
                                   deliver=feed.encoded, max_width=self.settings.live_max_width,
                                   compute=compute, totals=self.encoding)
        return feed.encoder

    def forget(self, stream_id: str) -> None:
        """The stream is gone: its viewers end."""
        self._feeds.pop(stream_id, None)
        for viewer in [v for v in self._viewers.values() if v.stream_id == stream_id]:
            self.close(viewer, "stream_ended")

    # -- viewers ---------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return len(self._viewers)

    @property
    def dropped(self) -> int:
        return self.ended["behind"]

    @property
    def skips(self) -> int:
        """Times viewers skipped to a keyframe, ended ones included."""
        return self._skips_ended + sum(v.track.stats.skips for v in self._viewers.values())

    def feed(self, stream_id: str) -> LiveFeed:
        """The stream's feed, or NotOffered saying why it has no live video: live encoding is off
        (`webrtc.live_encode`) and its packets are not H.264 or it has none, or its frames could
        not be encoded (x264 refused them)."""
        feed = self._feeds.get(stream_id)
        if feed is None and self.settings.live_encode:
            raise NotOffered("the stream has not started yet")
        if feed is None:
            raise NotOffered("live video is forwarded from sources that demux (cameras, files and HTTP streams read "
                             "with PyAV), and this stream's frames are not encoded for viewers "
                             "(webrtc.live_encode is off)")
        if feed.encoder is None and feed.codec not in (None, "h264"):
            raise NotOffered(f"the stream's video is {feed.codec}: live video is forwarded for H.264 only, and "
                             "other streams are not encoded for viewers (webrtc.live_encode is off)")
        if feed.encoder is not None and feed.encoder.failure is not None and not feed.forwarding:
            raise NotOffered(f"the stream's frames cannot be encoded for viewers ({feed.encoder.failure})")
        return feed

    def viewer(self, stream_id: str, resource_id: str) -> Viewer | None:
        found = self._viewers.get(resource_id)
        matches = same_resource(resource_id, found.resource_id if found is not None else None)
        return found if found is not None and matches and found.stream_id == stream_id else None

    async def open(self, stream_id: str, sdp: str) -> ViewerAnswer:
        """A viewer of `stream_id` for the offer `sdp` (checked by offer.parse_offer first)."""
        if self._closing:
            raise SessionsClosed("the service is shutting down")
        feed = self.feed(stream_id)
        if len(self._viewers) + self._negotiating >= self.settings.max_viewers:
            self.refused += 1
            raise ViewerLimitReached(self.settings.max_viewers)
        self._negotiating += 1
        pc = RTCPeerConnection(rtc_configuration(self.settings.ice_servers))
        accept_rsa_peers(pc)
        track = PacketTrack(max_packets=self.settings.viewer_queue_packets,
                            max_skips=self.settings.max_viewer_skips, on_behind=lambda: None)
        viewer = Viewer(stream_id, pc, track)
        track._on_behind = lambda: self.close(viewer, "behind")
        try:
            await self._negotiate(viewer, sdp)
        except BaseException:
            track.stop()
            await pc.close()
            raise
        finally:
            self._negotiating -= 1
        self._viewers[viewer.resource_id] = viewer
        feed.joined(track)
        self.opened += 1
        pc.on("connectionstatechange", lambda: self._connection_state(viewer))
        viewer.timer = self._timers.spawn(self._connect_within(viewer), f"{stream_id}-viewer-connect")
        log.info("live viewer opened", extra={"stream_id": stream_id, "viewers": len(self._viewers)})
        return ViewerAnswer(pc.localDescription.sdp, viewer.resource_id, viewer.etag)

    async def _negotiate(self, viewer: Viewer, sdp: str) -> None:
        pc = viewer.pc
        screened = screen_candidates(sdp, allow_local=self.settings.allow_local_candidates)
        await read_offer(pc, screened.sdp)
        video = [t for t in pc.getTransceivers() if t.kind == "video"]
        if not video or video[0].direction not in ("recvonly", "sendrecv"):
            raise BadOffer("sdp", "the offer receives no video (a WHEP offer has a recvonly video section)")
        # Packets are forwarded as they came or encoded: H.264 or nothing. aiortc picks the codecs in
        # common while it reads the offer, so the choice is narrowed afterwards (setCodecPreferences would
        # only apply to the next negotiation).
        wanted = [c for c in RTCRtpSender.getCapabilities("video").codecs if c.mimeType.lower() in H264_AND_RTX]
        common = filter_preferred_codecs(video[0]._codecs, wanted)
        if not any(c.mimeType.lower() == "video/h264" for c in common):
            raise BadOffer("sdp", "the client does not receive H.264, the only codec sent")
        video[0]._codecs = common
        pc.addTrack(viewer.track)
        await make_answer(pc, " (does the client receive H.264?)")

    async def _connect_within(self, viewer: Viewer) -> None:
        await asyncio.sleep(self.settings.connect_timeout_s)
        if viewer.pc.connectionState != "connected" and viewer.end_reason is None:
            self.close(viewer, "connect_timeout")  # webrtc.connect_timeout_s

    def _connection_state(self, viewer: Viewer) -> None:
        if viewer.pc.connectionState in ("failed", "closed"):
            self.close(viewer, "connection")

    def close(self, viewer: Viewer, reason: str) -> None:
        """End `viewer` (idempotent); its peer connection closes in the background. `reason`, one of
        ENDINGS, is counted."""
        if viewer.end_reason is not None:
            return
        viewer.end_reason = reason
        self._viewers.pop(viewer.resource_id, None)
        feed = self._feeds.get(viewer.stream_id)
        if feed is not None:
            feed.viewers.discard(viewer.track)
        viewer.track.stop()
        self.ended[reason] += 1
        self._skips_ended += viewer.track.stats.skips
        log.info("live viewer ended", extra={"stream_id": viewer.stream_id, "reason": reason,
                                             "packets": viewer.track.stats.packets,
                                             "skips": viewer.track.stats.skips})
        if viewer.timer is not None and viewer.timer is not asyncio.current_task():
            viewer.timer.cancel()
        task = self._closes.spawn(viewer.pc.close(), f"{viewer.stream_id}-viewer-close")
        self._closing_peers.add(task)
        task.add_done_callback(self._closing_peers.discard)

    async def aclose(self) -> None:
        """End every viewer and wait until every peer connection is closed (shutdown)."""
        self._closing = True
        for viewer in list(self._viewers.values()):
            self.close(viewer, "shutdown")
        if self._closing_peers:
            await asyncio.gather(*self._closing_peers, return_exceptions=True)
        await self._timers.cancel_all()
